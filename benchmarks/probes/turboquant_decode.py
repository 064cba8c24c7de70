"""Where a TurboQuant decode call spends its time, on a CUDA device (a developer's probe).

For each decode shape (M = 1): the whole ``turboquant_triton`` call, the input rotation
alone, the fused GEMV alone (autotuned, and every GEMV tile forced in turn, each checked
against the autotuned output), and cuBLAS bf16 — all timed as CUDA-graph replays over
weight sets that together exceed L2, so host launch cost is out of the numbers.

    python -m quantcore.benchmarks.probes.turboquant_decode [--shape K,N ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import torch
import triton
from tabulate import tabulate

from quantcore.backends.turboquant_triton import fused
from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
from quantcore.formats.turboquant import TurboQuant
from quantcore.nn.turboquant.kernel import rotate_input
from quantcore.timing import time_interleaved

from ..ceilings import ceilings
from ..memory import rotation_sets
from ..suites.turboquant_linear import format_bytes

FMT = TurboQuant(bits=4, group_size=128)
DTYPE = torch.bfloat16
SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))
#: Extra GEMV tiles to try beside the autotuned set: (BLOCK_N, GROUPS, L1_LOOKUP, warps, stages).
SWEEP = [
    (bn, gp, l1, w, s)
    for bn, gp, w in ((4, 4, 2), (4, 8, 4), (8, 2, 2), (8, 4, 4), (8, 8, 8), (16, 2, 4), (16, 4, 4), (32, 2, 4))
    for l1 in (False, True)
    for s in (3,)
]


def _quantized_sets(k: int, n: int, sets: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(n, k, device="cuda", generator=gen) * 0.02
    base = FMT.quantize(weight, generator=torch.Generator().manual_seed(0))  # rotations: drawn on the CPU
    out = [base]
    for _ in range(sets - 1):
        t = dict(base)
        t["indices"] = torch.randint(0, 256, base["indices"].shape, dtype=torch.uint8, device="cuda", generator=gen)
        out.append(t)
    return out


def _gemv_forced(cfg: tuple[int, int, bool, int, int]) -> Callable[..., torch.Tensor]:
    bn, gp, l1, w, s = cfg

    def run(x_rot: torch.Tensor, data: Any, codebook: torch.Tensor) -> torch.Tensor:
        k = x_rot.shape[1]
        n = data.indices.shape[0]
        out = torch.empty(1, n, dtype=DTYPE, device="cuda")
        fused._gemv_body[(triton.cdiv(n, bn), 1)](
            x_rot, data.indices, data.scales, codebook, out, out, data.scales,
            N=n, K=k, stride_idx=data.indices.stride(0), N_GROUPS=k // FMT.group_size,
            HALF=FMT.group_size // 2, LEVELS=codebook.shape[0], HAS_PARTIAL=False, HAS_BIAS=False,
            BLOCK_N=bn, GROUPS=gp, L1_LOOKUP=l1, num_warps=w, num_stages=s,
        )
        return out

    return run


def probe_shape(k: int, n: int, rounds: int) -> list[dict[str, Any]]:
    sets = rotation_sets(format_bytes(FMT, 1, k, n), "cuda")
    weights = _quantized_sets(k, n, sets)
    kernel = TurboQuantTriton(FMT, "cuda")
    prepared = [kernel.prepare(w, dtype=DTYPE) for w in weights]
    xs = [torch.randn(1, k, device="cuda", dtype=DTYPE) for _ in range(sets)]
    x_rots = [rotate_input(x, p.passes[0].rotation) for x, p in zip(xs, prepared, strict=True)]
    cb = prepared[0].codebook
    auto = [fused.fused_pass(xr, p.passes[0].indices, p.passes[0].scales, cb, group_size=FMT.group_size,
                             partial=None, bias=None, out_dtype=DTYPE) for xr, p in zip(x_rots, prepared, strict=True)]
    dense = [torch.randn(n, k, device="cuda", dtype=DTYPE) for _ in range(rotation_sets(2 * k * n, "cuda"))]

    variants: dict[str, tuple[Callable[[int], object], int, int]] = {
        "call (rotation + gemv)": (lambda i: kernel(xs[i % sets], prepared[i % sets]), sets, format_bytes(FMT, 1, k, n)),
        "rotation alone": (lambda i: rotate_input(xs[i % sets], prepared[i % sets].passes[0].rotation), sets,
                           2 * k * 2 + FMT.group_size ** 2 * 2),
        "gemv autotuned": (lambda i: fused.fused_pass(
            x_rots[i % sets], prepared[i % sets].passes[0].indices, prepared[i % sets].passes[0].scales, cb,
            group_size=FMT.group_size, partial=None, bias=None, out_dtype=DTYPE), sets, format_bytes(FMT, 1, k, n)),
        "cuBLAS bf16": (lambda i: torch.nn.functional.linear(xs[i % sets], dense[i % len(dense)]), len(dense),
                        2 * (k * n + k + n)),
    }
    mismatched = []
    for cfg in SWEEP:
        run = _gemv_forced(cfg)
        try:
            got = [run(xr, p.passes[0], cb) for xr, p in zip(x_rots, prepared, strict=True)]
        except Exception as exc:  # a tile that does not compile is a row, not the end of the probe
            mismatched.append(f"{cfg}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        err = max(float((g.float() - a.float()).abs().max() / a.float().abs().max()) for g, a in zip(got, auto, strict=True))
        if err > 1e-2:
            mismatched.append(f"{cfg}: max rel diff {err:.2e} vs autotuned")
            continue
        variants[f"gemv {cfg}"] = (lambda i, run=run: run(x_rots[i % sets], prepared[i % sets].passes[0], cb),
                                   sets, format_bytes(FMT, 1, k, n))
    names = list(variants)
    timings = time_interleaved([v[0] for v in variants.values()], "cuda", rounds=rounds, graph=True,
                               sets=[v[1] for v in variants.values()])
    copy = ceilings("cuda").copy_bytes_per_s
    bf16 = timings[names.index("cuBLAS bf16")].median_s
    rows = [{"K": k, "N": n, "variant": name, "us": t.median_s * 1e6, "spread": t.spread,
             "copy_share": variants[name][2] / t.median_s / copy, "vs_bf16": bf16 / t.median_s}
            for name, t in zip(names, timings, strict=True)]
    for line in mismatched:
        print(f"  K{k}-N{n} skipped {line}", file=sys.stderr)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", help="K,N (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shape] if args.shape else SHAPES
    rows = []
    for k, n in shapes:
        rows += probe_shape(k, n, args.rounds)
    print(tabulate([[r["K"], r["N"], r["variant"], f"{r['us']:.1f} ±{100 * r['spread']:.0f}%",
                     f"{100 * r['copy_share']:.0f}%", f"{r['vs_bf16']:.2f}×"] for r in rows],
                   headers=["K", "N", "variant", "µs (graph)", "of copy BW", "vs cuBLAS bf16"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
