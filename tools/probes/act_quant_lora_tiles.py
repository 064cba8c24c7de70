"""Time tile candidates of the act_quant_lora Triton kernel on this GPU, each checked bit
for bit against ``svdquant_torch`` (its own arithmetic, held to the golden bytes by the
matrix), beside cuBLAS's LoRA-down alone and the measured copy bandwidth::

    python -m tools.probes.act_quant_lora_tiles [--out DIR] [--quick]

Every candidate is compiled first by a pool of processes (Triton's on-disk cache is
shared), then timed as CUDA-graph replays over rotating inputs larger than L2. Prints a
table per shape (fastest first) and writes ``sweep.json``. The fastest exact candidate of
each shape is what :mod:`quantcore.kernels.svdquant.configs` ships.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from quantcore.kernels.svdquant.triton_kernel import Tile, smem_bytes

__all__ = ["CANDIDATES", "SHAPES", "main"]

SHAPES = [(m, n, r) for m in (4352, 256) for n in (3840, 10240) for r in (32, 128)]


def _tiles(big: bool) -> list[Tile]:
    """Candidates for a large (M = 4352) or small (M = 256) batch: tile shapes × register
    caps × programs per launch (grid and cap are launch options: only the shape, the cap
    and the tree compile differently)."""
    out = []
    if big:
        for (bm, bn, warps), cap, grid in itertools.product(
                [(64, 64, 4), (64, 128, 4), (128, 64, 8)], (None, 128, 168), (0, 396, 528)):
            if not (grid == 528 and cap != 128):  # four programs per SM fit 128 registers only
                out.append(Tile(bm, bn, warps, 3, grid, 1, cap))
        # 8 warps on 64 rows: half the quantizer per thread, fewer programs (LoRA partials)
        for cap, grid in itertools.product((None, 128), (132, 264)):
            out.append(Tile(64, 64, 8, 3, grid, 1, cap))
    else:
        for (bm, bn), cap, grid in itertools.product(
                [(16, 64), (16, 128), (32, 64), (32, 128), (64, 64), (64, 128)], (None, 128), (33, 66, 132, 264)):
            out.append(Tile(bm, bn, 4, 3, grid, 1, cap))
        # three and four 4-warp programs an SM (128 registers), the occupancy the compile
        # report allows at M = 256, where the shipped tiles run one or two
        for (bm, bn), grid in itertools.product([(16, 64), (16, 128), (32, 64), (32, 128)], (396, 528)):
            out.append(Tile(bm, bn, 4, 3, grid, 1, 128))
    return out


CANDIDATES = {big: _tiles(big) for big in (True, False)}


def _layer(n: int, r: int, device: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "lora_down": (torch.randn(n, r, generator=gen) * 0.05).to(device, torch.bfloat16),
        "smooth": torch.exp(torch.randn(n, generator=gen) * 0.5).to(device, torch.bfloat16),
    }


def _kernel(fp4: bool, device: str) -> Any:
    from quantcore.backends.triton_ascend_int4 import TritonAscendInt4
    from quantcore.backends.triton_nvfp4 import TritonNVFP4
    from quantcore.formats.svdquant import SVDQuantAct

    return (TritonNVFP4 if fp4 else TritonAscendInt4)(SVDQuantAct(fp4=fp4), device)


def _compile(job: tuple[bool, int, int, list[Tile]]) -> int:
    """Compile candidates of one (format, N, R) by running each once on a small batch."""
    fp4, n, r, tiles = job
    kernel = _kernel(fp4, "cuda")
    gen = torch.Generator().manual_seed(0)
    prepared = kernel.prepare(_layer(n, r, "cuda", gen), dtype=torch.bfloat16)
    x = torch.randn(256, n, generator=gen).to("cuda", torch.bfloat16)
    done = 0
    for tile in tiles:
        try:
            kernel.forward(x, prepared, tile=tile)
            done += 1
        except Exception as exc:  # reported again, with its shape, by the timing pass
            print(f"compile {fp4} N{n} R{r} {tile}: {type(exc).__name__}: {exc}", file=sys.stderr)
    torch.cuda.synchronize()
    return done


def graph_time(fn: Any, sets: int, calls: int = 24, replays: int = 7) -> float:
    """Median seconds per call of ``fn(i)`` over CUDA-graph replays of ``calls`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(sets):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    calls = sets * -(-calls // sets)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / calls)
    del graph
    return statistics.median(times)


def _same(out: Any, ref: Any, fp4: bool) -> tuple[bool, float]:
    bits = torch.uint8 if fp4 else torch.int16
    exact = torch.equal(out.qout, ref.qout) and torch.equal(out.oscales.view(bits), ref.oscales.view(bits))
    a, b = out.lora_act_out.double(), ref.lora_act_out.double()
    rel = float((a - b).norm() / b.norm().clamp_min(1e-30)) if b.numel() else 0.0
    return exact, rel


def op_bytes(fp4: bool, m: int, n: int, r: int) -> int:
    """The fewest bytes one call moves (bf16 x, smooth on), as the benchmark counts them."""
    m_pad = -(-m // 256) * 256
    return 2 * m * n + 2 * n * r + 4 * n + m_pad * n // 2 + m_pad * (n // (16 if fp4 else 64)) * (1 if fp4 else 2) \
        + 4 * m_pad * r


def copy_bandwidth() -> float:
    """Bytes read + written per second by one 1 GiB device-to-device copy."""
    src = torch.randn(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / graph_time(lambda i: dst.copy_(src), 1, calls=4)


def main(out: Path, *, quick: bool = False, big_only: bool = False, procs: int = 14) -> list[dict[str, Any]]:
    from quantcore.backends.svdquant_torch import TorchActQuantLora
    from quantcore.formats.svdquant import SVDQuantAct

    shapes = SHAPES[:1] + SHAPES[4:5] if quick else SHAPES
    if big_only:
        shapes = [s for s in shapes if s[0] > 512]
    t0 = time.perf_counter()
    def compiled_apart(tiles: list[Tile]) -> list[Tile]:  # one per compiled variant (grid is a launch option)
        return list({(t.bm, t.bn, t.num_warps, t.num_stages, t.tree, t.maxnreg): t for t in tiles}.values())

    jobs = [(fp4, n, r, [t]) for fp4, (n, r) in itertools.product((True, False), sorted({(n, r) for _, n, r in shapes}))
            for t in compiled_apart(CANDIDATES[True] + CANDIDATES[False]) if smem_bytes(t, r) <= 200 * 1024]
    ctx = torch.multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(procs, len(jobs)), mp_context=ctx) as pool:
        compiled = sum(pool.map(_compile, jobs))
    print(f"compiled {compiled} kernels in {time.perf_counter() - t0:.0f}s", flush=True)
    copy = copy_bandwidth()
    out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bytes_per_s": copy}
    rows: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(1)
    for m, n, r in shapes:
        sets = max(2, min(64, -(-(100 << 20) // (2 * m * n))))  # together twice an H100's L2
        xs = [(torch.randn(m, n, generator=gen) * 2).to("cuda", torch.bfloat16) for _ in range(sets)]
        layer = _layer(n, r, "cuda", gen)
        w = layer["lora_down"]
        cublas = graph_time(lambda i, xs=xs, w=w: xs[i % len(xs)] @ w, sets)
        cublas_bytes = 2 * m * n + 2 * n * r + 2 * m * r
        for fp4 in (True, False):
            fmt = SVDQuantAct(fp4=fp4)
            kernel = _kernel(fp4, "cuda")
            prepared = kernel.prepare(layer, dtype=torch.bfloat16)
            torch_kernel = TorchActQuantLora(fmt, "cuda")
            ref = torch_kernel(xs[0], torch_kernel.prepare(layer, dtype=torch.bfloat16))
            nbytes = op_bytes(fp4, m, n, r)
            results: list[dict[str, Any]] = []
            for tile in [None, *[t for t in CANDIDATES[m > 512] if smem_bytes(t, r) <= 200 * 1024]]:
                label = "default" if tile is None else str(asdict(tile))
                try:
                    exact, rel = _same(kernel.forward(xs[0], prepared, tile=tile), ref, fp4)
                    sec = graph_time(lambda i, t=tile, k=kernel, xs=xs, p=prepared: k.forward(xs[i % len(xs)], p, tile=t),
                                     sets)
                except Exception as exc:
                    print(f"  {label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                results.append({"fp4": fp4, "M": m, "N": n, "R": r, "tile": None if tile is None else asdict(tile),
                                "time_s": sec, "bytes": nbytes, "copy_share": nbytes / sec / copy,
                                "vs_cublas": cublas / sec, "exact": exact, "lora_rel": rel,
                                "cublas_s": cublas, "cublas_copy_share": cublas_bytes / cublas / copy})
            results.sort(key=lambda row: row["time_s"])
            rows += results
            tag = "nvfp4" if fp4 else "int4"
            print(f"{tag} M{m} N{n} R{r}: floor {nbytes / copy * 1e6:.1f} µs, cuBLAS LoRA-down {cublas * 1e6:.1f} µs "
                  f"({cublas_bytes / cublas / copy:.0%} of copy)", flush=True)
            for row in results[:5]:
                t = row["tile"]
                desc = "default" if t is None else f"bm{t['bm']} bn{t['bn']} w{t['num_warps']} s{t['num_stages']} " \
                                                   f"g{t['grid']} t{t['tree']} r{t['maxnreg']}"
                print(f"   {row['time_s'] * 1e6:7.1f} µs {row['copy_share']:5.0%} {row['vs_cublas']:5.2f}x "
                      f"{'exact' if row['exact'] else 'DIFF '} lora {row['lora_rel']:.1e}  {desc}", flush=True)
        del xs
        torch.cuda.empty_cache()
        (out / "sweep.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))  # as it goes
    print(f"sweep done in {time.perf_counter() - t0:.0f}s", flush=True)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--quick", action="store_true", help="two shapes only")
    parser.add_argument("--big-only", action="store_true", help="M = 4352 only")
    args = parser.parse_args()
    main(args.out, quick=args.quick, big_only=args.big_only)
