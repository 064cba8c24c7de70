"""Why the ``turboquant_linear`` suite and the decode sweep (``turboquant_tune``) time the
same table entry differently at M = 1: one process, CUDA-graph replays, the same layer
reached five ways — the suite's call (``kernel(x, prepared)`` on the suite's weight
sets), ``fused_linear`` with no config (the table's), with the table's config named, that
config without programmatic dependent launch, and the sweep's own weight sets — beside
cuBLAS bf16. Each row also says whether the bucket the call made launches with PDL.

    python -m tools.probes.turboquant_call_paths --json PATH
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import torch

from quantcore.backends.turboquant_triton import configs
from quantcore.backends.turboquant_triton.fused import fused_linear
from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
from quantcore.benchmarks.memory import rotation_sets
from quantcore.benchmarks.suites.turboquant_linear import format_bytes, weight_sets
from quantcore.formats.turboquant import TurboQuant
from quantcore.probe.card import card_key
from quantcore.timing import time_interleaved
from quantcore.triton.launch import launch_state

from .probe_rows import record_times, write_rows
from .turboquant_paths import _weights
from .turboquant_tune import GEMV_PAIRS, _time

DTYPE = torch.bfloat16
CASES = ((14336, 4096, 1), (4096, 14336, 2), (14336, 4096, 2), (4096, 14336, 1))


def _pdl_of(prepared: Any) -> list[bool]:
    """Whether each decode bucket kept with this layer's codebook launches with PDL."""
    state = launch_state(prepared.codebook)
    return [bool(b.launch._kwargs.get("PDL")) for k, b in state.items() if k[0] == "gemv"]


def _sweep_list(shipped: Any, passes: int) -> list[Any]:
    """The decode candidates ``turboquant_tune --gemv-only`` times for this layer."""
    cands = [dataclasses.replace(shipped, lookup=lk) for lk in ("single", "pairs", "half_pairs")]
    cands += GEMV_PAIRS[passes]
    cands += [dataclasses.replace(shipped, pdl=True), dataclasses.replace(shipped, lookup="pairs", pdl=True),
              dataclasses.replace(shipped, pdl=False)]
    return list(dict.fromkeys(cands))


def case(k: int, n: int, passes: int, rounds: int, rows: list[dict[str, Any]]) -> None:
    fmt = TurboQuant(bits=4, group_size=128, residual=passes == 2)
    kernel = TurboQuantTriton(fmt, "cuda")
    suite_p = [kernel.prepare(w, dtype=DTYPE) for w in weight_sets(fmt, k, n, "cuda")]
    sets = rotation_sets(format_bytes(fmt, 1, k, n), "cuda")
    sweep_p = [kernel.prepare(w, dtype=DTYPE) for w in _weights(fmt, k, n, sets, "cuda")]
    xs = [torch.randn(1, k, device="cuda", dtype=DTYPE) for _ in range(max(len(suite_p), sets, 4))]
    shipped = configs.gemv_config(card_key(0), k, n, 128, passes, DTYPE)
    plain = dataclasses.replace(shipped, pdl=False)

    def fused(prepared: list[Any], cfg: Any) -> Callable[[int], Any]:
        return lambda i: fused_linear(xs[i % len(xs)], prepared[i % len(prepared)].passes,
                                      prepared[i % len(prepared)].codebook, group_size=128, partial=None, bias=None,
                                      out_dtype=DTYPE, path="gemv", config=cfg)

    ws = [torch.randn(n, k, device="cuda", dtype=DTYPE) for _ in range(rotation_sets(2 * k * n, "cuda"))]
    variants: dict[str, tuple[Callable[[int], Any], int]] = {
        "suite call": (lambda i: kernel(xs[i % 4], suite_p[i % len(suite_p)]), len(suite_p)),
        "cuBLAS bf16": (lambda i: torch.nn.functional.linear(xs[i % len(xs)], ws[i % len(ws)]), len(ws)),
        "fused_linear, config None": (fused(suite_p, None), len(suite_p)),
        "fused_linear, table config": (fused(suite_p, shipped), len(suite_p)),
        "fused_linear, table config without PDL": (fused(suite_p, plain), len(suite_p)),
        "sweep weights, table config": (fused(sweep_p, shipped), len(sweep_p)),
        "sweep weights, config None": (fused(sweep_p, None), len(sweep_p)),
    }
    names = list(variants)
    times = time_interleaved([f for f, _ in variants.values()], "cuda", rounds=rounds, graph=True,
                             sets=[s for _, s in variants.values()])
    where = {"k": k, "n": n, "passes": passes}
    record_times(rows, names, times, where)
    for r in rows:
        if all(r[a] == v for a, v in where.items()):
            r["table_config"] = dataclasses.asdict(shipped)
    # The sweep's own timing function: the table's config with and without PDL, alone, and
    # beside the sweep's whole candidate list.
    for label, cands in (("alone", [shipped, plain]), ("in the sweep's list", _sweep_list(shipped, passes))):
        for t, _, cfg in _time(k, n, 1, passes, [("gemv", c) for c in cands], rounds):
            if cfg in (shipped, plain):
                rows.append({**where, "variant": f"sweep _time {label}, table config{'' if cfg.pdl else ' without PDL'}",
                             "us": t * 1e6})
    rows.append({**where, "variant": "buckets' PDL", "suite": _pdl_of(suite_p[0]), "sweep": _pdl_of(sweep_p[0]),
                 "suite_sets": len(suite_p), "sweep_sets": len(sweep_p)})
    for r in rows[-len(names) - 5:]:
        print({a: (round(v, 2) if isinstance(v, float) else v) for a, v in r.items() if a != "table_config"},
              file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default=",".join(f"{k}x{n}x{p}" for k, n, p in CASES), help="KxNxPASSES,...")
    ap.add_argument("--pad-mb", type=int, default=0,
                    help="allocate and hold this many MB first (moves every weight to other addresses)")
    args = ap.parse_args()
    pad = torch.empty(args.pad_mb << 20, dtype=torch.uint8, device="cuda")
    rows: list[dict[str, Any]] = []
    for spec in args.cases.split(","):
        k, n, passes = (int(v) for v in spec.split("x"))
        case(k, n, passes, args.rounds, rows)
        write_rows(args.json, [*rows, {"variant": "pad", "mb": args.pad_mb, "address": pad.data_ptr()}])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
