"""The tensor-core kernel of ``turboquant_triton`` with its weight operand through shared
memory (the default) or made in the matrix unit's register layout
(``MmaConfig.register_operand``, ``backends/turboquant_triton/operand.py``), that with the
group scale in the operand (``MmaConfig.scaled_operand``), timed on one GPU. A
developer's probe, CUDA.

1. Correctness first, per (K, N, M): every variant against the float64 golden output
   (relative error ≤ 2e-2) and against the shared-memory operand (the bf16 tolerance of
   the conformance matrix: the sum over a group runs in another order) — the scaled
   operand against the golden at that tolerance instead (it rounds c · s, not c, to bf16:
   another arithmetic, configs.MmaConfig); then, with a
   dyadic codebook, power-of-two scales, integer activations and signed-permutation
   rotations (every product and sum exact, whatever the split of K), bit for bit the shared-memory operand — which checks what the
   interpreter cannot: the inline PTX and the pairing of the int16 codes in registers.
   A failure prints ``FAIL``, is not timed, and makes the exit status 1.
2. Device time (CUDA-graph replays over weight sets that together exceed L2, all variants
   and cuBLAS bf16 in the same rounds): the card's configuration for the M bucket (else
   the rule's) with the shared-memory operand and with the register operand, and the
   register operand with twice the programs (``ctas``: it leaves room for 5-6 programs an
   SM at 64×16 instead of 4) and with one pipeline stage fewer, and the register operand
   with the scale in it (``register scaled``: no wgmma wait for all of a group's MMAs in
   the group loop, one float32 multiply a weight more; ``backends/turboquant_triton/README.md``).

    python -m tools.probes.turboquant_operand [--json PATH] [--rounds 3] [--ms 16 32 64 128]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from tabulate import tabulate

from quantcore.backends.turboquant_triton import configs
from quantcore.backends.turboquant_triton.fused import fused_linear
from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
from quantcore.benchmarks.memory import rotation_sets
from quantcore.benchmarks.suites.turboquant_linear import format_bytes
from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.formats.turboquant import TurboQuant
from quantcore.probe.card_tables import card_of
from quantcore.timing import time_interleaved

from .turboquant_paths import _rel_error, _weights

DTYPE = torch.bfloat16
DEVICE = "cuda"
D = 128
SHAPES = ((4096, 14336), (14336, 4096), (4096, 4096))
MS = (16, 32, 64, 128)
FAILURES: list[str] = []


def _fail(where: str, problem: str) -> None:
    FAILURES.append(f"FAIL {where}: {problem}")
    print(FAILURES[-1], file=sys.stderr, flush=True)


def variants(k: int, n: int, m: int) -> dict[str, configs.MmaConfig]:
    """The shipped tile (table or rule, x rotated outside) with each operand, the register
    operand with twice the programs and with one stage fewer, and with the scale in it."""
    base = configs.mma_entry(card_of(DEVICE), m, k, n, D, 1, DTYPE) or configs.mma_rule(m, False)
    base = dataclasses.replace(base, rotate_in_kernel=False, rotate_once=False, register_operand=False)
    reg = dataclasses.replace(base, register_operand=True)
    out = {"shared": base, "register": reg, "register 2x ctas": dataclasses.replace(reg, ctas=2 * reg.ctas)}
    if reg.stages > 2:
        out[f"register s{reg.stages - 1}"] = dataclasses.replace(reg, stages=reg.stages - 1)
    out["register scaled"] = dataclasses.replace(reg, scaled_operand=True)
    return out


def _call(cfg: configs.MmaConfig, x: torch.Tensor, prep: Any) -> torch.Tensor:
    return fused_linear(x, prep.passes, prep.codebook, group_size=D, partial=None, bias=None, out_dtype=DTYPE,
                        path="mma", config=cfg)


def exact_check(k: int, n: int, m: int, cfgs: dict[str, configs.MmaConfig], prep: Any) -> None:
    """Every register-operand variant bit for bit the shared-memory operand on inputs whose
    products and sums are exact (module docstring). The scaled operand too: it is not
    bit-identical in general (it rounds c · s to bf16 where the others round c and scale
    the group's float32 sum), but here every c · s (a dyadic centroid k/4 − 2 times a power
    of two) is exact in bf16, so both roundings are exact and only the inline PTX's pairing
    of codes and scales can make a difference."""
    gen = torch.Generator().manual_seed(k + n + m)
    codebook = prep.codebook.clone()
    codebook[:16] = (torch.randperm(16, generator=gen).float() / 4 - 2).to(codebook.device)
    pi = torch.zeros(1, D, D)
    pi[0, torch.arange(D), torch.randperm(D, generator=gen)] = torch.randint(0, 2, (D,), generator=gen).float() * 2 - 1
    # Power-of-two scales: every group's scaled sum, and the sum over groups in any split
    # of K between programs, is exact in float32, so a variant with another split must
    # still give the same bits.
    scales = 2.0 ** torch.randint(-3, 2, prep.passes[0].scales.shape, generator=gen).float()
    p = dataclasses.replace(prep.passes[0], rotation=pi.to(DEVICE, DTYPE), scales=scales.to(DEVICE))
    exact = dataclasses.replace(prep, codebook=codebook, passes=(p,))
    x = torch.randint(-8, 9, (m, k), generator=gen).to(DEVICE, DTYPE)
    old = _call(cfgs["shared"], x, exact)
    for name, cfg in cfgs.items():
        if name != "shared" and not torch.equal(_call(cfg, x, exact), old):
            _fail(f"K{k} N{n} M{m} {name}", "exact inputs: not bit-identical to the shared-memory operand")


def device_rows(k: int, n: int, m: int, rounds: int) -> list[dict[str, Any]]:
    fmt = TurboQuant(bits=4, group_size=D)
    sets = rotation_sets(format_bytes(fmt, m, k, n), DEVICE)
    weights = _weights(fmt, k, n, sets, DEVICE)
    kernel = TurboQuantTriton(fmt, DEVICE)
    prepared = [kernel.prepare(w, dtype=DTYPE) for w in weights]
    xs = [torch.randn(m, k, device=DEVICE, dtype=DTYPE) for _ in range(sets)]
    ref = xs[0].double() @ fmt.dequantize(weights[0]).T  # float64 golden, set 0
    dense = [torch.randn(n, k, device=DEVICE, dtype=DTYPE) for _ in range(rotation_sets(2 * k * n, DEVICE))]
    cfgs = variants(k, n, m)
    shared = _call(cfgs["shared"], xs[0], prepared[0])
    keep: dict[str, tuple[Callable[[int], Any], int, dict[str, Any]]] = {}
    rows = []
    for name, cfg in cfgs.items():
        base = {"K": k, "N": n, "M": m, "variant": name, "config": dataclasses.asdict(cfg)}
        try:
            y = _call(cfg, xs[0], prepared[0])
            torch.cuda.synchronize()
        except Exception as exc:  # a variant that fails is a row, not the end of the probe
            rows.append({**base, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            _fail(f"K{k} N{n} M{m} {name}", rows[-1]["error"])
            continue
        err = _rel_error(y, ref)
        against = "the float64 golden" if cfg.scaled_operand else "the shared-memory operand"
        versus = compare(y, (ref if cfg.scaled_operand else shared).to("cpu", torch.float64), tolerance_for(DTYPE))
        problem = ("" if err <= 2e-2 else f"relative error {err:.2e} to the float64 golden > 2e-2") or \
                  ("" if versus.ok else f"against {against}: {versus.problem}")
        if problem:
            rows.append({**base, "rel_error": err, "error": f"wrong result: {problem}"})
            _fail(f"K{k} N{n} M{m} {name}", problem)
            continue
        keep[name] = ((lambda i, c=cfg: _call(c, xs[i % sets], prepared[i % sets])), sets, {**base, "rel_error": err})
    exact_check(k, n, m, cfgs, prepared[0])
    keep["cuBLAS bf16"] = ((lambda i: torch.nn.functional.linear(xs[i % sets], dense[i % len(dense)])), len(dense),
                           {"K": k, "N": n, "M": m, "variant": "cuBLAS bf16"})
    timings = time_interleaved([v[0] for v in keep.values()], DEVICE, rounds=rounds, graph=True,
                               sets=[v[1] for v in keep.values()])
    by_name = dict(zip(keep, timings, strict=True))
    bf16, old = by_name["cuBLAS bf16"], by_name.get("shared")
    for name, t in by_name.items():
        rows.append({**keep[name][2], "us": t.median_s * 1e6, "spread": t.spread, "method": t.method,
                     "vs_bf16": bf16.median_s / t.median_s, "vs_shared": old.median_s / t.median_s if old else None})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--ms", type=int, nargs="*", default=list(MS))
    args = ap.parse_args()
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "card": str(card_of(DEVICE)), "rows": []}
    t0 = time.time()
    for k, n in SHAPES:
        for m in args.ms:
            out["rows"] += device_rows(k, n, m, args.rounds)
            print(f"  done K{k} N{n} M{m} at {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)
    print(tabulate([[r["K"], r["N"], r["M"], r["variant"],
                     f"{r['us']:.1f} ±{100 * r['spread']:.0f}%" if "us" in r else r.get("error", ""),
                     f"{r['vs_bf16']:.2f}×" if r.get("vs_bf16") else "",
                     f"{r['vs_shared']:.2f}×" if r.get("vs_shared") else "", f"{r.get('rel_error', 0):.1e}"]
                    for r in out["rows"]],
                   headers=["K", "N", "M", "variant", "µs (graph)", "vs bf16", "vs shared", "rel err"]))
    out["failures"] = FAILURES
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    for line in FAILURES:
        print(line)
    print(f"{len(FAILURES)} FAILURES" if FAILURES else "correctness: every variant passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    raise SystemExit(main())
