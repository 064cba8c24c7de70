"""The act_quant_lora plan options on this GPU, in one run (a few minutes on an H100)::

    python -m tools.probes.act_quant_lora_plans --out FILE [--table DIR] [--quick] [--m 4352] [--stages 1,2]

(``--out`` defaults to ``$SVDQUANT_PLANS_OUT``, else ``act_quant_lora_plans.json``.) For
each format and shape of the benchmark (M = 4352 and 256; N = 3840 and 10240; R = 32 and
128; bf16, smooth on) it takes the tile this card ships (the table or the rule) as the
baseline and the plan options on it and on a few neighbours (``Tile.flat``, ``prefetch``,
``red``; quantcore/kernels/svdquant/README.md says what each changes), and per candidate:

- checks codes and scales bit for bit against the baseline kernel's on the GPU (the
  baseline itself against ``svdquant_torch``), the LoRA output bit for bit against the
  baseline where the steps and their order are the same (same bm, bn and programs), else
  its relative difference, the LoRA bits over two calls and the ticket counters left at 0
  (the ticket protocol);
- times it with ``quantcore.timing.time_interleaved(graph=True)`` beside cuBLAS's LoRA-down
  alone (``x @ lora_down``) and a device copy of the op's bytes, over inputs rotating
  through more than twice the L2.

Writes one flat JSON file: ``meta`` (device, card, versions, the 1 GiB copy rate) and one
row per candidate. ``--table DIR`` also writes ``DIR/tuned-<card slug>.json``: the fastest
candidate per shape that is exact and deterministic — what
:mod:`quantcore.kernels.svdquant.configs` reads when the file is committed beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from quantcore.kernels.svdquant.triton_kernel import Tile, smem_bytes

__all__ = ["SHAPES", "candidates", "main", "run_case", "table"]

SHAPES = [(m, n, r) for m in (4352, 256) for n in (3840, 10240) for r in (32, 128)]
ENV_OUT = "SVDQUANT_PLANS_OUT"
#: Where the candidates run: a GPU (a test runs one small case under the interpreter).
DEVICE = "cuda"


def baseline(fp4: bool, m: int, n: int, r: int) -> Tile:
    """The tile this card runs the shape with today (its table, the nearest one, or the rule)."""
    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.formats.svdquant.numerics import padded_rows
    from quantcore.kernels.svdquant.configs import shipped_tile
    from quantcore.kernels.svdquant.triton_kernel import pick_tile
    from quantcore.probe.card_tables import card_of

    m_pad = padded_rows(m, 256)
    return (shipped_tile(card_of("cuda"), SVDQuantAct(fp4=fp4), m_pad, n, r, torch.bfloat16, True)
            or pick_tile(m_pad, n, r, fp4))


def candidates(base: Tile, m: int, r: int, stages: tuple[int, ...] = ()) -> list[Tile]:
    """The baseline first, then the plan options on it and on a few neighbours, and the
    baseline with each software-pipeline depth of ``stages`` (1: x loaded to registers and
    stored to shared memory for the dot by the threads, no asynchronous copies)."""
    rep = dataclasses.replace
    out = [base, rep(base, prefetch=True), *(rep(base, num_stages=s) for s in stages)]
    out += [rep(base, flat=True), rep(base, flat=True, prefetch=True)]
    if m > 512:
        out += [rep(base, flat=True, prefetch=True, num_stages=4)]
        # 8 warps on 64 rows: half the quantizer and the R = 128 accumulator per thread
        eight = Tile(64, 64, 8, 3, 264, 1, 128)
        out += [eight, rep(eight, flat=True, prefetch=True)]
        if base.maxnreg != 168 or base.per_sm != 3 or base.grid:
            out += [rep(Tile(64, 64, 4, 3, 0, 1, 168, 3), flat=True, prefetch=True)]
    else:
        out += [rep(base, red=4), rep(base, red=8), rep(base, prefetch=True, red=8)]
        # more, smaller programs: four 4-warp programs an SM under 128 registers
        more = Tile(16, 64, 4, 3, 528, 1, 128)
        out += [more, rep(more, flat=True, prefetch=True), rep(more, prefetch=True, red=8)]
    seen: dict[Tile, None] = {}
    for tile in out:
        if smem_bytes(tile, r) <= 200 * 1024:
            seen.setdefault(tile)
    return list(seen)


def _layer(n: int, r: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "lora_down": (torch.randn(n, r, generator=gen) * 0.05).to(DEVICE, torch.bfloat16),
        "smooth": torch.exp(torch.randn(n, generator=gen) * 0.5).to(DEVICE, torch.bfloat16),
    }


def _kernel(fp4: bool) -> Any:
    from quantcore.backends.triton_ascend_int4 import TritonAscendInt4
    from quantcore.backends.triton_nvfp4 import TritonNVFP4
    from quantcore.formats.svdquant import SVDQuantAct

    return (TritonNVFP4 if fp4 else TritonAscendInt4)(SVDQuantAct(fp4=fp4), DEVICE)


def _compile(job: tuple[bool, int, int, int, list[Tile]]) -> list[str]:
    """Compile the candidates of one case (Triton's on-disk cache is shared) by running each
    once at the case's M (the flat plan's slot count depends on it); returns the failures."""
    fp4, m, n, r, tiles = job
    kernel = _kernel(fp4)
    gen = torch.Generator().manual_seed(0)
    prepared = kernel.prepare(_layer(n, r, gen), dtype=torch.bfloat16)
    x = torch.randn(m, n, generator=gen).to("cuda", torch.bfloat16)
    failed = []
    for tile in tiles:
        try:
            kernel.forward(x, prepared, tile=tile)
        except Exception as exc:  # reported with the case by the timing pass too
            failed.append(f"{tile.describe()}: {type(exc).__name__}: {str(exc)[:300]}")
    torch.cuda.synchronize()
    return failed


def op_bytes(fp4: bool, m: int, n: int, r: int) -> int:
    """The fewest bytes one call moves (bf16 x, smooth on), as the benchmark counts them."""
    m_pad = -(-m // 256) * 256
    return 2 * m * n + 2 * n * r + 4 * n + m_pad * n // 2 + m_pad * (n // (16 if fp4 else 64)) * (1 if fp4 else 2) \
        + 4 * m_pad * r


def copy_rate() -> float:
    """Bytes read + written per second by a 1 GiB device-to-device copy (CUDA graphs)."""
    from quantcore.timing import time_interleaved

    src = torch.randn(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    (t,) = time_interleaved([lambda i: dst.copy_(src)], "cuda", rounds=5, graph=True, graph_calls=4)
    return 2 * (1 << 28) * 4 / t.median_s


def _bits(out: Any, fp4: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return out.qout, out.oscales.view(torch.uint8 if fp4 else torch.int16)


def _tickets_clear(prepared: Any) -> bool:
    """Whether every kept ticket counter of the layer's buckets is back at 0 (the last program
    of each shared row tile resets its own); one left over is zeroed, so a broken candidate
    cannot fail the ones timed after it."""
    from quantcore.kernels.svdquant.triton_launch import launch_state

    clear = True
    for bucket in launch_state(prepared.lora_down).values():
        if bucket.shared and bucket.keeps:
            tickets = bucket._kept_scratch()[1]
            if int(tickets.abs().sum()):
                clear = False
                tickets.zero_()
    return clear


def _lora_bits(t: torch.Tensor) -> torch.Tensor:
    """The LoRA output's bits with −0.0 as +0.0 (a reset accumulator may start a sum either way)."""
    return (t + 0.0).view(torch.int32)


def run_case(fp4: bool, m: int, n: int, r: int, tiles: list[Tile], copy: float, gen: torch.Generator) -> list[dict]:
    """One format and shape: a row per candidate (``tiles[0]`` the baseline), checked and timed."""
    from quantcore.backends.svdquant_torch import TorchActQuantLora
    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.timing import time_interleaved

    fmt = SVDQuantAct(fp4=fp4)
    sets = max(2, min(64, -(-(100 << 20) // (2 * m * n))))  # together more than twice an H100's L2
    xs = [(torch.randn(m, n, generator=gen) * 2).to(DEVICE, torch.bfloat16) for _ in range(sets)]
    layer = _layer(n, r, gen)
    w = layer["lora_down"]
    kernel = _kernel(fp4)
    prepared = kernel.prepare(layer, dtype=torch.bfloat16)
    torch_kernel = TorchActQuantLora(fmt, DEVICE)
    gold = torch_kernel(xs[0], torch_kernel.prepare(layer, dtype=torch.bfloat16))
    nbytes = op_bytes(fp4, m, n, r)
    src = torch.empty(nbytes // 2 // 2, dtype=torch.bfloat16, device=DEVICE)  # half the bytes read, half written
    dst = torch.empty_like(src)

    base = tiles[0]
    ref = kernel.forward(xs[0], prepared, tile=base)
    ref_q, ref_s = _bits(ref, fp4)
    gold_q, gold_s = _bits(gold, fp4)
    base_golden = torch.equal(ref_q, gold_q) and torch.equal(ref_s, gold_s)
    rows, fns, kept = [], [], []
    for tile in tiles:
        row: dict[str, Any] = {"fmt": "nvfp4" if fp4 else "int4", "M": m, "N": n, "R": r, "bytes": nbytes,
                               "tile": dataclasses.asdict(tile), "describe": tile.describe(),
                               "baseline": tile == base}
        try:
            a = kernel.forward(xs[0], prepared, tile=tile)
            b = kernel.forward(xs[0], prepared, tile=tile)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            continue
        q, s = _bits(a, fp4)
        same_walk = (tile.bm, tile.bn, tile.grid, tile.per_sm) == (base.bm, base.bn, base.grid, base.per_sm)
        la, lb, lr = a.lora_act_out, b.lora_act_out, ref.lora_act_out
        row.update({
            "codes_scales_exact": bool(torch.equal(q, ref_q) and torch.equal(s, ref_s) and base_golden),
            "lora_bits_as_baseline": bool(torch.equal(_lora_bits(la), _lora_bits(lr))),
            "lora_bits_expected_equal": same_walk,
            "lora_rel_to_baseline": float((la.double() - lr.double()).norm() / lr.double().norm().clamp_min(1e-30)),
            "lora_rel_to_torch": float((la.double() - gold.lora_act_out.double()).norm()
                                       / gold.lora_act_out.double().norm().clamp_min(1e-30)),
            "deterministic": bool(torch.equal(la.view(torch.int32), lb.view(torch.int32))),
            "tickets_reset": _tickets_clear(prepared),
        })
        row["ok"] = row["codes_scales_exact"] and row["deterministic"] and row["tickets_reset"] and (
            row["lora_rel_to_torch"] < 1e-4) and (row["lora_bits_as_baseline"] or not same_walk)
        rows.append(row)
        kept.append(row)
        fns.append(lambda i, t=tile: kernel.forward(xs[i % sets], prepared, tile=t))
    timings = time_interleaved([lambda i: xs[i % sets] @ w, lambda i: dst.copy_(src), *fns], DEVICE,
                               rounds=7 if DEVICE == "cuda" else 1, graph=True, sets=[sets, 1, *[sets] * len(fns)])
    cublas, same_size_copy = timings[0].median_s, timings[1].median_s
    base_s = next((timing.median_s for row, timing in zip(kept, timings[2:], strict=True) if row["baseline"]), None)
    for row, timing in zip(kept, timings[2:], strict=True):
        row.update({"us": timing.median_s * 1e6, "spread": timing.spread, "method": timing.method,
                    "copy_share": nbytes / timing.median_s / copy, "vs_cublas": cublas / timing.median_s,
                    "vs_baseline": base_s / timing.median_s if base_s else None,
                    "cublas_us": cublas * 1e6, "cublas_copy_share": (2 * m * n + 2 * n * r + 4 * m * r) / cublas / copy,
                    "same_size_copy_us": same_size_copy * 1e6})
    return rows


def table(rows: list[dict], meta: dict) -> dict:
    """``tuned-<card>.json``: the fastest ok candidate per shape (the baseline among them)."""
    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.kernels.svdquant.configs import config_key

    best: dict[str, dict] = {}
    for row in rows:
        if not row.get("ok") or "us" not in row:
            continue
        key = config_key(SVDQuantAct(fp4=row["fmt"] == "nvfp4"), -(-row["M"] // 256) * 256, row["N"], row["R"],
                         torch.bfloat16, True)
        if key not in best or row["us"] < best[key]["us"]:
            best[key] = {"key": key, "tile": row["tile"], "us": round(row["us"], 2),
                         "vs_baseline": round(row["vs_baseline"] or 0.0, 3), "copy_share": round(row["copy_share"], 3)}
    return {"card": meta["card"], "measured_on": meta["device"], "source": "tools/probes/act_quant_lora_plans.py",
            "entries": sorted(best.values(), key=lambda e: e["key"])}


def main(out: Path, *, table_dir: Path | None = None, quick: bool = False, procs: int = 12,
         ms: tuple[int, ...] = (), stages: tuple[int, ...] = ()) -> list[dict]:
    import triton

    from quantcore.probe.card_tables import card_fields, cuda_card

    t0 = time.perf_counter()
    shapes = [SHAPES[0], SHAPES[5]] if quick else SHAPES
    shapes = [shape for shape in shapes if not ms or shape[0] in ms]
    cases = [(fp4, m, n, r, candidates(baseline(fp4, m, n, r), m, r, stages)) for fp4, (m, n, r) in
             itertools.product((True, False), shapes)]
    ctx = torch.multiprocessing.get_context("spawn")
    jobs = [(fp4, m, n, r, [t]) for fp4, m, n, r, tiles in cases for t in tiles]
    with ProcessPoolExecutor(max_workers=min(procs, len(jobs)), mp_context=ctx) as pool:
        failures = [f for part in pool.map(_compile, jobs) for f in part]
    print(f"compiled {len(jobs)} candidates in {time.perf_counter() - t0:.0f}s, {len(failures)} failed", flush=True)
    for f in failures:
        print("  compile failure:", f, flush=True)
    card = cuda_card(torch.device("cuda"))
    meta = {"device": torch.cuda.get_device_name(), "card": card_fields(card), "card_slug": card.slug,
            "torch": torch.__version__, "triton": triton.__version__, "copy_bytes_per_s": copy_rate()}
    rows: list[dict] = []
    gen = torch.Generator().manual_seed(1)
    out.parent.mkdir(parents=True, exist_ok=True)
    for fp4, m, n, r, tiles in cases:
        part = run_case(fp4, m, n, r, tiles, meta["copy_bytes_per_s"], gen)
        torch.cuda.empty_cache()  # the case's inputs and graphs are gone with it
        rows += part
        timed = sorted((row for row in part if "us" in row), key=lambda row: row["us"])
        if timed:
            print(f"{timed[0]['fmt']} M{m} N{n} R{r}: cuBLAS LoRA-down {timed[0]['cublas_us']:.1f} µs, copy of the "
                  f"op's bytes {timed[0]['same_size_copy_us']:.1f} µs", flush=True)
        for row in timed:
            flag = "ok  " if row["ok"] else "BAD "
            print(f"   {flag}{row['us']:7.1f} µs {row['copy_share']:5.0%} {row['vs_cublas']:5.2f}x cuBLAS "
                  f"{row['vs_baseline'] or 0:5.2f}x base  {'*' if row['baseline'] else ' '} {row['describe']}",
                  flush=True)
        for row in part:
            if "error" in row:
                print(f"   FAIL {row['describe']}: {row['error']}", flush=True)
        out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))  # as it goes
    if table_dir is not None:
        table_dir.mkdir(parents=True, exist_ok=True)
        path = table_dir / f"tuned-{card.slug}.json"
        path.write_text(json.dumps(table(rows, meta), indent=1) + "\n")
        print(f"wrote {path}", flush=True)
    print(f"done in {time.perf_counter() - t0:.0f}s: {out}", flush=True)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get(ENV_OUT, "act_quant_lora_plans.json")))
    parser.add_argument("--table", type=Path, default=None, help="write DIR/tuned-<card slug>.json")
    parser.add_argument("--quick", action="store_true", help="two shapes only")
    parser.add_argument("--m", default="", help="only these batch sizes (comma-separated, e.g. 4352)")
    parser.add_argument("--stages", default="", help="also the baseline at these pipeline depths (e.g. 1,2)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("act_quant_lora_plans: needs a CUDA GPU")
    main(args.out, table_dir=args.table, quick=args.quick, ms=tuple(int(v) for v in args.m.split(",") if v),
         stages=tuple(int(v) for v in args.stages.split(",") if v))
