"""Where the time of TurboQuant's prefill paths goes (a developer's probe, CUDA): each part
of ``dequant + cuBLAS`` and ``fold + cuBLAS`` timed alone as CUDA-graph replays, beside
the bytes floor of the weight-writing kernels at the copy bandwidth measured in the same
run, with launch variants of both kernels:

* ``dequant`` — ``dequant.py`` writing one pass into ``W_cat`` (rows a program, groups a
  program, warps);
* ``fold`` — ``fold.py`` writing ``W_eff`` (``configs.FoldConfig`` variants), one and two passes;
* ``rotate`` — the input rotation GEMM at M; ``gemm`` — cuBLAS on the dense scratch at M;
  ``cuBLAS bf16`` — the dense layer itself.

Each weight-writing variant is checked against the shipped launch first: within one bf16
ulp (a register-operand fold sums each group in another order), bit-identity recorded.

    python -m tools.probes.turboquant_prefill_parts [--m 2048] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch
import triton

from quantcore.backends.turboquant_triton import configs
from quantcore.backends.turboquant_triton.dequant import dequant_kernel
from quantcore.backends.turboquant_triton.fused import (
    _Dequant,
    _Folded,
    _words,
    interpreting,
)
from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
from quantcore.benchmarks.ceilings import ceilings
from quantcore.formats.turboquant import TurboQuant
from quantcore.timing import time_interleaved
from tools.probes.probe_rows import rotating, write_rows

DTYPE = torch.bfloat16
SHAPES = ((4096, 14336), (14336, 4096), (4096, 4096))
#: dequant.py launches: (rows a program, groups a program, warps); the first is the shipped one
#: (d = 128).
DEQUANT_VARIANTS = ((4, 8, 1), (32, 2, 4), (8, 4, 2), (4, 4, 1), (2, 8, 1), (4, 16, 1))
F = configs.FoldConfig
#: fold.py launches; the first two are the shipped ones (d = 128, one and two passes).
FOLD_VARIANTS = (configs.FOLD_NARROW, configs.FOLD_NARROW_TWO_PASSES, F(), F(block_n=64, warps=4, groups=8, stages=2, register_operand=True),
                 F(block_n=64, warps=4, persistent=3, stages=4, register_operand=True),
                 F(block_n=64, warps=4, persistent=4, stages=3, maxnreg=128, register_operand=True),
                 F(block_n=64, warps=4, persistent=2, stages=3, register_operand=True))
SETS = 3  # weight sets rotated over (each set's indices are distinct memory)


def _prepared(k: int, n: int, residual: bool, device: str) -> list[Any]:
    fmt = TurboQuant(bits=4, group_size=128, residual=residual)
    gen = torch.Generator(device=device).manual_seed(0)
    base = fmt.quantize(torch.randn(n, k, device=device, generator=gen) * 0.02,
                        generator=torch.Generator().manual_seed(0))
    kernel = TurboQuantTriton(fmt, device)
    out = []
    for s in range(SETS):
        t = dict(base)
        if s:
            for name in base:
                if name.endswith("indices"):
                    t[name] = torch.randint(0, 256, base[name].shape, dtype=torch.uint8, device=device, generator=gen)
        out.append(kernel.prepare(t, dtype=DTYPE))
    return out


def _dequant_call(prep: Any, k: int, n: int, variant: tuple[int, int, int], w: torch.Tensor) -> Callable[[], None]:
    block_n, gpc, warps = variant
    data = prep.passes[0]
    groups = k // 128
    grid = (triton.cdiv(n, block_n), triton.cdiv(groups, gpc))
    words = _words(data.indices)

    def run() -> None:
        dequant_kernel[grid](words, data.scales, prep.codebook, w, n, k // 8, k, 0, N_GROUPS=groups, D=128,
                             BLOCK_N=block_n, GPC=gpc, PASSES=1, INTERPRET=interpreting(), num_warps=warps)
    return run


def _fold_call(prep: Any, k: int, n: int, config: configs.FoldConfig, w: torch.Tensor) -> Callable[[], None]:
    folded = _Folded(prep.passes, prep.codebook, 128, None, w.device, DTYPE, config)
    return lambda: folded.fold(w)


def _close(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """Within one bf16 unit in the last place of the shipped launch's value, or of the mean
    magnitude where two passes cancel (a variant that sums a group in another order may
    round the other way)."""
    diff = (got.float() - ref.float()).abs()
    return bool((diff <= 2.0 ** -7 * ref.float().abs() + 2.0 ** -12 * ref.float().abs().mean()).all())


def _dense_parts(prep: Any, k: int, n: int, m: int, ws: list[torch.Tensor], copy: float,
                 device: str) -> dict[str, tuple[list[Callable[[], Any]], float, None]]:
    """The input rotation, cuBLAS on the scratch, and the dense layer, at M rows."""
    x = [torch.randn(m, k, device=device, dtype=DTYPE) for _ in range(SETS)]
    rot = _Dequant(prep.passes, prep.codebook, 128, None, torch.device(device), DTYPE).rotate
    outs = [torch.empty(m, n, device=device, dtype=DTYPE) for _ in range(SETS)]
    dense = [torch.randn(n, k, device=device, dtype=DTYPE) for _ in range(SETS)]

    def rotate(i: int) -> Callable[[], Any]:
        return lambda: rot(x[i])

    def gemm(i: int) -> Callable[[], Any]:
        return lambda: torch.mm(x[i], ws[i].t(), out=outs[i])

    def linear(i: int) -> Callable[[], Any]:
        return lambda: torch.nn.functional.linear(x[i], dense[i])

    return {f"rotate x (M={m})": ([rotate(i) for i in range(SETS)], 4 * m * k / copy, None),
            f"gemm on the scratch (M={m})": ([gemm(i) for i in range(SETS)], 0.0, None),
            f"cuBLAS bf16 (M={m})": ([linear(i) for i in range(SETS)], 0.0, None)}


def probe(k: int, n: int, m: int, rounds: int, device: str = "cuda") -> list[dict[str, Any]]:
    copy = ceilings(device).copy_bytes_per_s
    variants: dict[str, tuple[list[Callable[[], Any]], float, None]] = {}
    failed: dict[str, str] = {}
    checks: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for residual in (False, True):
        preps = _prepared(k, n, residual, device)
        passes = len(preps[0].passes)
        idx_bytes = passes * n * k // 2
        if not residual:
            ws = [torch.empty(n, k, dtype=DTYPE, device=device) for _ in range(SETS)]
            floor = (idx_bytes + 2 * n * k) / copy
            ref = None
            for v in DEQUANT_VARIANTS:
                fns = [_dequant_call(p, k, n, v, w) for p, w in zip(preps, ws, strict=True)]
                fns[0]()
                got = ws[0].clone()
                if ref is None:
                    ref = got
                name = f"dequant rows {v[0]} groups {v[1]} warps {v[2]}"
                checks[name] = (got, ref)
                variants[name] = (fns, floor, None)
            variants |= _dense_parts(preps[0], k, n, m, ws, copy, device)
        ws2 = [torch.empty(n, k, dtype=DTYPE, device=device) for _ in range(SETS)]
        floor = (idx_bytes + 2 * n * k) / copy
        ref = None
        for fv in FOLD_VARIANTS:
            fns = [_fold_call(p, k, n, fv, w) for p, w in zip(preps, ws2, strict=True)]
            walk = f"persistent {fv.persistent}/SM" if fv.persistent else f"groups {fv.groups}"
            name = (f"fold {passes}p rows {fv.block_n} w{fv.warps} {walk} stages {fv.stages}"
                    f" maxnreg {fv.maxnreg or 0}{' reg' if fv.register_operand else ''}")
            try:
                fns[0]()
            except Exception as exc:  # a variant that does not compile or launch is a row
                failed[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
                continue
            got = ws2[0].clone()
            if ref is None:  # the one-pass launch: the two-pass one is checked against it
                ref = got
            checks[name] = (got, ref)
            variants[name] = (fns, floor, None)
    bad = {name for name, (got, ref) in checks.items() if not _close(got, ref)}
    identical = {name: torch.equal(got, ref) for name, (got, ref) in checks.items()}
    names = [name for name in variants if name not in bad]
    timings = time_interleaved([rotating(variants[nm][0]) for nm in names], device, rounds=rounds, graph=True,
                               sets=[SETS] * len(names))
    rows = [{"K": k, "N": n, "M": m, "part": name, "us": t.median_s * 1e6, "spread": t.spread, "method": t.method,
             "floor_us": variants[name][1] * 1e6,
             "floor_share": variants[name][1] / t.median_s if variants[name][1] else None,
             "bit_identical_to_shipped": identical.get(name)}
            for name, t in zip(names, timings, strict=True)]
    rows += [{"K": k, "N": n, "M": m, "part": name, "error": "more than one bf16 ulp from the shipped launch"}
             for name in sorted(bad)]
    rows += [{"K": k, "N": n, "M": m, "part": name, "error": err} for name, err in failed.items()]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for k, n in SHAPES:
        rows += probe(k, n, args.m, args.rounds)
        print(f"  done K{k} N{n}", file=sys.stderr, flush=True)
    for r in rows:
        share = f"{r['floor_share']:.0%}" if r.get("floor_share") else ""
        print(f"K{r['K']:>5} N{r['N']:>5} {r['part']:<44} {r.get('us', float('nan')):8.1f} µs {share:>5}"
              f" {r.get('error', '')}")
    if args.json:
        write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
