"""The GPTQ dequantization kernel of ``triton_int4``'s large-M path (``dequant_kernel``
writing Ŵ [N, K] for cuBLAS) alone, per launch variant (rows a program, warps), as
CUDA-graph replays beside its bytes floor at the copy bandwidth measured in the same run,
and the whole path (dequantize + cuBLAS) at M = 2048 beside cuBLAS bf16 (a developer's
probe, CUDA). Each variant is checked bit for bit against the shipped launch first.

    python -m tools.probes.triton_int4_dequant [--bits 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch
import triton

from quantcore.backends.triton_int4.configs import DEQUANT_BLOCK_N
from quantcore.backends.triton_int4.launch import _common
from quantcore.benchmarks.ceilings import ceilings
from quantcore.kernels.gptq_pairs.triton_kernels import dequant_kernel
from quantcore.timing import time_interleaved
from tools.probes.probe_rows import rotating, write_rows
from tools.probes.triton_int4_tiles import random_weights

DTYPE = torch.bfloat16
SHAPES = ((4096, 14336), (14336, 4096), (4096, 4096))
#: (rows a program, warps); the first is the shipped launch.
VARIANTS = ((DEQUANT_BLOCK_N, 4), (32, 4), (32, 2), (16, 2), (16, 1), (8, 1), (64, 8), (128, 8))
SETS = 3
M = 2048


def _launch(w: Any, n: int, k: int, rows: int, warps: int, out: torch.Tensor) -> Callable[[], None]:
    common = _common(w)
    groups, sub = common.pop("NUM_GROUPS"), common.pop("NUM_SUB")
    any_t = w.scales
    fixed = (w.qweight.view(torch.int16), w.scales, w.zeros if w.zeros is not None else any_t,
             w.group_map if w.group_map is not None else any_t)
    grid = (triton.cdiv(n, rows), w.blocks, 1)

    def run() -> None:
        dequant_kernel[grid](*fixed, out, n, k, groups, sub, **common, BLOCK_N=rows, num_warps=warps)
    return run


def probe(k: int, n: int, bits: int, rounds: int) -> list[dict[str, Any]]:
    copy = ceilings("cuda").copy_bytes_per_s
    ws = random_weights(k, n, bits, SETS, "cuda")
    outs = [torch.empty(n, k, dtype=DTYPE, device="cuda") for _ in range(SETS)]
    floor = (n * k * bits / 8 + 2 * n * k) / copy
    names, fns, floors = [], [], []
    ref = None
    for rows, warps in VARIANTS:
        calls = [_launch(w, n, k, rows, warps, o) for w, o in zip(ws, outs, strict=True)]
        calls[0]()
        got = outs[0].clone()
        ref = got if ref is None else ref
        name = f"dequant rows {rows} warps {warps}"
        if not torch.equal(got, ref):
            print(f"  K{k} N{n} {name}: not bit-identical to the shipped launch", file=sys.stderr)
            continue
        names.append(name)
        fns.append(rotating(calls))
        floors.append(floor)
        x = [torch.randn(M, k, device="cuda", dtype=DTYPE) for _ in range(SETS)]
        names.append(f"{name} + cuBLAS (M={M})")
        fns.append(rotating([_path(c, xi, o) for c, xi, o in zip(calls, x, outs, strict=True)]))
        floors.append(0.0)
    dense = [torch.randn(n, k, device="cuda", dtype=DTYPE) for _ in range(SETS)]
    xs = [torch.randn(M, k, device="cuda", dtype=DTYPE) for _ in range(SETS)]
    names.append(f"cuBLAS bf16 (M={M})")
    fns.append(rotating([_dense(xi, d) for xi, d in zip(xs, dense, strict=True)]))
    floors.append(0.0)
    timings = time_interleaved(fns, "cuda", rounds=rounds, graph=True, sets=[SETS] * len(fns))
    bf16 = timings[-1].median_s
    return [{"K": k, "N": n, "bits": bits, "part": name, "us": t.median_s * 1e6, "spread": t.spread,
             "floor_us": f * 1e6, "floor_share": f / t.median_s if f else None,
             "vs_bf16": bf16 / t.median_s if "cuBLAS" in name else None}
            for name, t, f in zip(names, timings, floors, strict=True)]


def _path(dequant: Callable[[], None], x: torch.Tensor, w: torch.Tensor) -> Callable[[], Any]:
    def run() -> Any:
        dequant()
        return torch.nn.functional.linear(x, w)
    return run


def _dense(x: torch.Tensor, w: torch.Tensor) -> Callable[[], Any]:
    return lambda: torch.nn.functional.linear(x, w)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for k, n in SHAPES:
        rows += probe(k, n, args.bits, args.rounds)
    for r in rows:
        extra = f"{r['floor_share']:.0%} of floor" if r["floor_share"] else f"{r['vs_bf16']:.2f}× cuBLAS"
        print(f"K{r['K']:>5} N{r['N']:>5} {r['part']:<40} {r['us']:8.1f} µs  {extra}")
    if args.json:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
