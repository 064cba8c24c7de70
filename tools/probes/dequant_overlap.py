"""Can the dequantize-then-GEMM path (large M) hide its dequantization behind cuBLAS?

From M ≈ 2048 the int4 kernels dequantize the weight into a bf16 scratch and call cuBLAS
(``backends/triton_int4``, ``backends/turboquant_triton/dequant.py``). The dequantization
is memory-bound (½ byte read and 2 bytes written per weight) and the GEMM compute-bound, so
run back to back the layer pays both. This times, as CUDA-graph replays, on a stand-in
dequantization of the same bytes (a Triton kernel: packed 4-bit rows → bf16 rows times a
per-row scale) over rotating weight sets larger than L2:

* ``cuBLAS`` — the dense GEMM alone (the target);
* ``serial`` — dequantize all of the weight, then one GEMM (today's path);
* ``chunks C`` — the same cut into C slices of N, each slice's GEMM written straight into
  its columns of the output (``torch.mm(..., out=y[:, a:b])``, no copy), one stream;
* ``overlap C`` — the slices with the dequantization of slice j+1 on a side stream while
  slice j multiplies, through a ring of two scratch slices.

    python -m tools.probes.dequant_overlap [--ms 2048,8192] [--shapes 4096x14336,...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from quantcore.timing import time_interleaved


@triton.jit
def _dequant_rows(q_ptr, s_ptr, out_ptr, ROWS, KH: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """``out[r, 2c + h] = (nibble h of q[r, c] − 8) · s[r]`` for rows ``[0, ROWS)``."""
    pid_r, pid_k = tl.program_id(0), tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows < ROWS)[:, None] & (cols < KH)[None, :]
    q = tl.load(q_ptr + rows[:, None].to(tl.int64) * KH + cols[None, :], mask=mask, other=0).to(tl.int32)
    s = tl.load(s_ptr + rows, mask=rows < ROWS, other=0.0)[:, None]
    lo = ((q & 15) - 8).to(tl.float32) * s
    hi = ((q >> 4) - 8).to(tl.float32) * s
    w = tl.reshape(tl.join(lo, hi), (BLOCK_R, 2 * BLOCK_K)).to(out_ptr.dtype.element_ty)
    ocols = pid_k * 2 * BLOCK_K + tl.arange(0, 2 * BLOCK_K)
    omask = (rows < ROWS)[:, None] & (ocols < 2 * KH)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * (2 * KH) + ocols[None, :], w, mask=omask)


def dequant(q: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> None:
    rows, kh = q.shape
    grid = (triton.cdiv(rows, 32), triton.cdiv(kh, 128))
    _dequant_rows[grid](q, s, out, rows, KH=kh, BLOCK_R=32, BLOCK_K=128, num_warps=4)


def _variants(m: int, k: int, n: int, sets: int, gen: torch.Generator) -> tuple[list[tuple[str, Any]], torch.Tensor]:
    dev = "cuda"
    qs = [torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev, generator=gen) for _ in range(sets)]
    ss = [torch.rand(n, device=dev, generator=gen) * 0.02 + 0.01 for _ in range(sets)]
    x = torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16)
    y = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    dense = [torch.randn(n, k, device=dev, generator=gen).to(torch.bfloat16) for _ in range(sets)]
    scratch = torch.empty(n, k, device=dev, dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def cublas(i: int) -> None:
        torch.mm(x, dense[i % sets].t(), out=y)

    def serial(i: int) -> None:
        dequant(qs[i % sets], ss[i % sets], scratch)
        torch.mm(x, scratch.t(), out=y)

    def bounds(c: int) -> list[tuple[int, int]]:
        step = -(-n // c)
        step = -(-step // 128) * 128
        return [(a, min(n, a + step)) for a in range(0, n, step)]

    def chunks(c: int) -> Any:
        def run(i: int) -> None:
            q, s = qs[i % sets], ss[i % sets]
            for a, b in bounds(c):
                dequant(q[a:b], s[a:b], scratch[: b - a])
                torch.mm(x, scratch[: b - a].t(), out=y[:, a:b])
        return run

    def overlap(c: int) -> Any:
        spans = bounds(c)
        width = max(b - a for a, b in spans)
        ring = [scratch[:width], scratch[width: 2 * width]] if 2 * width <= n else [
            scratch[:width], torch.empty(width, k, device=dev, dtype=torch.bfloat16)]

        def run(i: int) -> None:
            q, s = qs[i % sets], ss[i % sets]
            main = torch.cuda.current_stream()
            ready = [torch.cuda.Event() for _ in spans]
            done = [torch.cuda.Event() for _ in spans]
            side.wait_stream(main)
            for j, (a, b) in enumerate(spans):
                with torch.cuda.stream(side):
                    if j >= 2:
                        side.wait_event(done[j - 2])
                    dequant(q[a:b], s[a:b], ring[j % 2][: b - a])
                    ready[j].record(side)
            for j, (a, b) in enumerate(spans):
                main.wait_event(ready[j])
                torch.mm(x, ring[j % 2][: b - a].t(), out=y[:, a:b])
                done[j].record(main)
            main.wait_stream(side)
        return run

    out: list[tuple[str, Any]] = [("cuBLAS", cublas), ("serial", serial)]
    out += [(f"chunks {c}", chunks(c)) for c in (2, 4)]
    out += [(f"overlap {c}", overlap(c)) for c in (2, 3, 4, 6, 8)]
    return out, y


def _check(k: int, n: int, gen: torch.Generator) -> float:
    """The stand-in dequantization against its float reference: the largest error."""
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
    s = torch.rand(n, device="cuda", generator=gen) * 0.02 + 0.01
    w = torch.empty(n, k, device="cuda", dtype=torch.bfloat16)
    dequant(q, s, w)
    lo = (q & 15).to(torch.float32) - 8
    hi = (q >> 4).to(torch.float32) - 8
    gold = (torch.stack((lo, hi), -1).reshape(n, k) * s[:, None]).to(torch.bfloat16)
    return float((w.float() - gold.float()).abs().max())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ms", default="2048,8192")
    p.add_argument("--shapes", default="4096x14336,14336x4096,4096x4096")
    p.add_argument("--sets", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "triton": triton.__version__, "cases": []}
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        err = _check(k, n, gen)
        for m in (int(v) for v in args.ms.split(",")):
            variants, y = _variants(m, k, n, args.sets, gen)
            names = [v[0] for v in variants]
            variants[1][1](0)  # serial: what every other path must reproduce
            want = y.float().clone()
            diffs = {}
            for name, fn in variants[2:]:
                y.zero_()
                fn(0)
                torch.cuda.synchronize()
                diffs[name] = float((y.float() - want).abs().max() / want.abs().max())
            times = time_interleaved([v[1] for v in variants], "cuda", rounds=3, graph=True,
                                     sets=[args.sets] * len(variants), graph_calls=6)
            base = times[0].median_s
            rows = [{"variant": nm, "us": t.median_s * 1e6, "spread": t.spread, "method": t.method,
                     "x_cublas": base / t.median_s, "rel_diff_vs_serial": diffs.get(nm)}
                    for nm, t in zip(names, times, strict=True)]
            result["cases"].append({"m": m, "k": k, "n": n, "dequant_max_err": err, "rows": rows})
            line = "  ".join(f"{r['variant']} {r['us']:.1f} ({r['x_cublas']:.2f}×)" for r in rows)
            print(f"M={m} {k}x{n}: {line}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
