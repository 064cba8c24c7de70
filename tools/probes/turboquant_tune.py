"""Tune the ``turboquant_triton`` launch configurations on this CUDA device and write the
table ``configs.py`` reads (a developer's tool; its output is shipped as
``backends/turboquant_triton/tuned-<card slug>.json``, keyed by the card's features).

For each layer shape and pass count: the decode kernel's candidates at M = 1, the
tensor-core kernel's at M = 16 and 128, each checked against the float64 golden output
and timed as CUDA-graph replays; then the M where dequantize + cuBLAS overtakes the
tensor-core kernel. Keys carry the geometry (K, N, d, passes, dtype, M bucket).

    python -m tools.probes.turboquant_tune --out tuned.json
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

from quantcore.backends.turboquant_triton import configs
from quantcore.backends.turboquant_triton.fused import fused_linear
from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
from quantcore.benchmarks.memory import rotation_sets
from quantcore.benchmarks.suites.turboquant_linear import format_bytes
from quantcore.formats.turboquant import TurboQuant
from quantcore.probe.card import card_key
from quantcore.probe.card_tables import card_fields
from quantcore.timing import time_interleaved

from .turboquant_paths import _rel_error, _weights

DTYPE = torch.bfloat16
DEVICE = "cuda"
SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))
G = configs.GemvConfig
Mm = configs.MmaConfig
GEMV = [G(8, 396, 8, 8, 3), G(8, 264, 8, 8, 3), G(16, 264, 8, 8, 1), G(8, 264, 16, 8, 1), G(8, 396, 4, 4, 3)]
GEMV_RES = [G(8, 264, 8, 8, 1), G(8, 132, 8, 8, 1), G(8, 396, 8, 8, 1), G(16, 264, 8, 8, 1)]
# The plan variants (rotation once per call, a register cap): timed beside the above.
GEMV += list(configs.GEMV_VARIANTS)
GEMV_RES += [c for c in configs.GEMV_VARIANTS if c.unroll == 1]
MMA = {16: [Mm(64, 16, 4, 4, 3, 264), Mm(64, 16, 4, 4, 3, 528), Mm(64, 16, 8, 4, 4, 264)],
       128: [Mm(64, 64, 4, 4, 3, 264), Mm(64, 32, 4, 4, 3, 264), Mm(128, 64, 4, 8, 3, 264)]}
CROSSOVER_M = (256, 512, 1024)
#: ``--gemv-only``: the decode kernel with both indices of a byte looked up at once
#: (``pairs.py``), timed beside the card's shipped plan and that plan with each pair
#: table; a ``pairs`` candidate is also checked bit for bit against its single-lookup twin.
_GEOMETRIES = {1: [G(8, 396, 8, 8, 3), G(8, 264, 16, 8, 1), G(16, 264, 8, 8, 1), G(8, 264, 8, 8, 1)],
               2: [G(8, 264, 8, 8, 1), G(8, 396, 8, 8, 1), G(16, 264, 8, 8, 1)]}
GEMV_PAIRS = {p: [dataclasses.replace(g, lookup=lk) for g in gs for lk in ("pairs", "half_pairs")]
              for p, gs in _GEOMETRIES.items()}
#: ``--halves``, one pass: the two-pass plans' 8-row tile (where whole sectors paid) with and
#: without them, a wider grid, and paired lookups.
GEMV_HALVES = [G(8, 264, 8, 8, 1, halves=True), G(8, 264, 8, 8, 1), G(8, 396, 8, 8, 1, halves=True),
               G(8, 264, 8, 8, 1, lookup="pairs", halves=True), G(8, 264, 8, 8, 1, lookup="pairs", pdl=True, halves=True)]
#: ``--mma-only``: tiles for the weight operand in the matrix unit's register layout (76
#: registers and 28 KB at 64×16 on sm_90, six programs an SM instead of four: more
#: programs and stages fit), timed beside the card's shipped plan at each M bucket.
_R = dict(register_operand=True)
MMA_REGISTER = {
    16: [Mm(64, 16, 4, 4, 3, 528, **_R), Mm(64, 16, 4, 4, 4, 792, **_R), Mm(64, 16, 8, 4, 4, 528, **_R),
         Mm(64, 16, 2, 4, 3, 1056, **_R)],
    32: [Mm(64, 32, 4, 4, 3, 528, **_R), Mm(64, 32, 4, 4, 4, 396, **_R), Mm(64, 16, 4, 4, 4, 792, **_R)],
    64: [Mm(64, 64, 4, 4, 3, 264, **_R), Mm(64, 32, 4, 4, 3, 528, **_R), Mm(64, 64, 4, 4, 2, 396, **_R)],
    128: [Mm(64, 64, 4, 4, 3, 264, **_R), Mm(64, 64, 4, 4, 4, 264, **_R), Mm(64, 32, 4, 4, 3, 528, **_R)],
}
#: ``--mma-wide``: tiles as wide as the batch (each index word looked up once per call,
#: not once per 64-row slice of x) and longer group runs a program, beside the shipped
#: plan and dequantize + cuBLAS.
MMA_WIDE = {
    64: [Mm(64, 64, 8, 4, 3, 264, **_R), Mm(64, 64, 4, 4, 4, 396, **_R), Mm(64, 64, 2, 4, 3, 528, **_R),
         Mm(128, 64, 8, 8, 3, 264, **_R)],
    128: [Mm(64, 128, 4, 4, 3, 264, **_R), Mm(64, 128, 4, 4, 2, 264, **_R), Mm(64, 128, 8, 4, 3, 264, **_R),
          Mm(64, 128, 2, 4, 3, 396, **_R), Mm(64, 64, 8, 4, 3, 264, **_R),
          # two warpgroups, 16 rows a warp: no spill on any rotation route at sm_90
          Mm(128, 128, 4, 8, 3, 264, **_R), Mm(128, 128, 4, 8, 2, 264, **_R), Mm(128, 128, 8, 8, 2, 264, **_R)],
}


def _time(k: int, n: int, m: int, passes: int, candidates: list[tuple[str, Any]], rounds: int,
          twins: bool = False) -> list[tuple[float, str, Any]]:
    """The candidates that are right, fastest first. ``twins``: a decode config with
    ``pairs`` must also give exactly the output of the same config without it."""
    fmt = TurboQuant(bits=4, group_size=128, residual=passes == 2)
    sets = rotation_sets(format_bytes(fmt, m, k, n), DEVICE)
    weights = _weights(fmt, k, n, sets, DEVICE)
    kernel = TurboQuantTriton(fmt, DEVICE)
    prepared = [kernel.prepare(w, dtype=DTYPE) for w in weights]
    xs = [torch.randn(m, k, device=DEVICE, dtype=DTYPE) for _ in range(sets)]
    ref = xs[0].double() @ fmt.dequantize(weights[0]).T
    fns: list[Callable[[int], Any]] = []
    kept = []
    for path, cfg in candidates:
        def run(i: int, path: str = path, cfg: Any = cfg) -> torch.Tensor:
            p = prepared[i % sets]
            return fused_linear(xs[i % sets], p.passes, p.codebook, group_size=128, partial=None, bias=None,
                                out_dtype=DTYPE, path=path, config=cfg)
        try:
            err = _rel_error(run(0), ref)
        except Exception as exc:  # a candidate that fails is skipped, not the end of tuning
            print(f"  K{k} N{n} M{m} P{passes} {path} {cfg}: {type(exc).__name__}: {str(exc)[:160]}", file=sys.stderr)
            continue
        if err > 2e-2:
            print(f"  K{k} N{n} M{m} P{passes} {path} {cfg}: wrong (rel error {err:.3g})", file=sys.stderr)
            continue
        if twins and (getattr(cfg, "lookup", "single") != "single" or getattr(cfg, "pdl", False)):
            mine, single = run(0), run(0, cfg=dataclasses.replace(cfg, lookup="single", pdl=False))
            same = torch.equal(mine, single)
            _checks.append({"K": k, "N": n, "passes": passes, "config": dataclasses.asdict(cfg), "rel_error": err,
                            "bit_identical_to_single_lookup": same,
                            "rel_difference_to_single_lookup": _rel_error(mine, single.double())})
            if cfg.lookup != "half_pairs" and not same:
                print(f"  K{k} N{n} P{passes} {cfg}: differs from its single-lookup twin", file=sys.stderr)
                continue
        fns.append(run)
        kept.append((path, cfg))
    timings = time_interleaved(fns, DEVICE, rounds=rounds, graph=True, sets=[sets] * len(fns))
    return sorted((t.median_s, path, cfg) for t, (path, cfg) in zip(timings, kept, strict=True))


#: The pairs checks of a ``--gemv-only`` run (written beside its log).
_checks: list[dict[str, Any]] = []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mma-only", action="store_true",
                    help="only the tensor-core kernel: the register-operand tiles beside the shipped plan, one "
                         "pass, at --ms; entries for these buckets only (to merge into the shipped table)")
    ap.add_argument("--mma-wide", action="store_true",
                    help="only the tensor-core kernel at M = 64 and 128: batch-wide tiles and longer group runs "
                         "beside the shipped plan and dequantize + cuBLAS, one pass")
    ap.add_argument("--ms", default="16,32,64,128")
    ap.add_argument("--gemv-only", action="store_true",
                    help="only the decode kernel: the pairs candidates beside the shipped plan, 1 and 2 passes")
    ap.add_argument("--halves", action="store_true",
                    help="only the decode kernel: the shipped plan beside its twin that reads whole sectors "
                         "(GemvConfig.halves), 1 and 2 passes, --rounds rounds")
    ap.add_argument("--gemv-plain", action="store_true",
                    help="only the decode kernel's geometries at M = 1, one pass, beside the rule's plan: for "
                         "shapes no table holds (--shapes)")
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES),
                    help="weight shapes KxN,… (default: the turboquant_linear suite's)")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    device = torch.cuda.get_device_name()
    card = card_key(0)
    dtype = configs._dtype_name(DTYPE)
    entries: list[dict[str, Any]] = []
    log: list[dict[str, Any]] = []
    t0 = time.time()

    def write() -> None:
        doc = {"card": card_fields(card), "measured_on": device, "source": "tools/probes/turboquant_tune.py",
               "entries": entries}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"  wrote {args.out} (ship it as tuned-{card.slug}.json)", file=sys.stderr, flush=True)

    def record(kind: str, k: int, n: int, passes: int, ranked: list[tuple[float, str, Any]], m: int = 1) -> None:
        for t, path, cfg in ranked:
            log.append({"kernel": kind, "K": k, "N": n, "M": m, "passes": passes, "path": path,
                        "config": dataclasses.asdict(cfg) if cfg else None, "us": t * 1e6})
        best = next(((t, cfg) for t, path, cfg in ranked if path == kind), None)
        if best is None:
            return
        entry = {"kernel": kind, "K": k, "N": n, "d": 128, "passes": passes, "dtype": dtype,
                 "config": dataclasses.asdict(best[1]), "us": round(best[0] * 1e6, 2)}
        if kind == "mma":
            entry["m_bucket"] = configs.m_bucket(m)
        entries.append(entry)
        write()  # after every entry: a cut-off run keeps what it tuned
        print(f"  {kind} K{k} N{n} M{m} P{passes}: {best[0] * 1e6:.1f} µs {best[1]} ({time.time() - t0:.0f}s)",
              file=sys.stderr, flush=True)

    if args.gemv_plain:
        for k, n in shapes:
            rule = configs.gemv_config(card, k, n, 128, 1, DTYPE)
            cands = list(dict.fromkeys([rule, *GEMV]))
            record("gemv", k, n, 1, _time(k, n, 1, 1, [("gemv", c) for c in cands], args.rounds))
        with open(args.out.replace(".json", "") + "-log.json", "w") as f:
            json.dump({"device": device, "rows": log}, f, indent=1)
        return 0
    if args.halves:
        for k, n in shapes:
            for passes in (1, 2):
                shipped = configs.gemv_config(card, k, n, 128, passes, DTYPE)
                cands = [shipped, dataclasses.replace(shipped, halves=not shipped.halves)]
                cands += GEMV_HALVES if passes == 1 else []
                unique = list(dict.fromkeys(cands))
                record("gemv", k, n, passes, _time(k, n, 1, passes, [("gemv", c) for c in unique], args.rounds))
        with open(args.out.replace(".json", "") + "-log.json", "w") as f:
            json.dump({"device": device, "rows": log}, f, indent=1)
        return 0
    if args.gemv_only:
        for k, n in shapes:
            for passes in (1, 2):
                shipped = configs.gemv_config(card, k, n, 128, passes, DTYPE)
                cands = [dataclasses.replace(shipped, lookup=lk) for lk in ("single", "pairs", "half_pairs")]
                cands += GEMV_PAIRS[passes]
                cands += [dataclasses.replace(shipped, pdl=True), dataclasses.replace(shipped, lookup="pairs", pdl=True)]
                unique = list(dict.fromkeys(cands))
                record("gemv", k, n, passes, _time(k, n, 1, passes, [("gemv", c) for c in unique], args.rounds,
                                                    twins=True))
        with open(args.out.replace(".json", "") + "-log.json", "w") as f:
            json.dump({"device": device, "rows": log, "pairs_checks": _checks}, f, indent=1)
        return 0
    if args.mma_wide:
        for k, n in shapes:
            for m, wide in MMA_WIDE.items():
                shipped = configs.mma_config(card, m, k, n, 128, 1, DTYPE)
                cands = [("mma", shipped)] + [("mma", c) for c in wide if c != shipped] + [("dequant", None)]
                record("mma", k, n, 1, _time(k, n, m, 1, cands, args.rounds), m)
        with open(args.out.replace(".json", "") + "-log.json", "w") as f:
            json.dump({"device": device, "rows": log}, f, indent=1)
        return 0
    if args.mma_only:
        for k, n in shapes:
            for m in (int(v) for v in args.ms.split(",")):
                shipped = configs.mma_config(card, m, k, n, 128, 1, DTYPE)
                cands = [("mma", shipped)] + [("mma", c) for c in MMA_REGISTER[m] if c != shipped]
                record("mma", k, n, 1, _time(k, n, m, 1, cands, args.rounds), m)
        with open(args.out.replace(".json", "") + "-log.json", "w") as f:
            json.dump({"device": device, "rows": log}, f, indent=1)
        return 0
    for k, n in shapes:
        for passes, cands in ((1, GEMV), (2, GEMV_RES)):
            record("gemv", k, n, passes, _time(k, n, 1, passes, [("gemv", c) for c in cands], args.rounds))
        for m, cands in MMA.items():
            record("mma", k, n, 1, _time(k, n, m, 1, [("mma", c) for c in cands], args.rounds), m)
    record("mma", 4096, 14336, 2, _time(4096, 14336, 16, 2, [("mma", c) for c in MMA[16]], args.rounds), 16)
    # Where dequantize + cuBLAS overtakes the tensor-core kernel (on the largest layer).
    mma_max = 128
    for m in CROSSOVER_M:
        ranked = _time(4096, 14336, m, 1, [("mma", configs.mma_config(None, m, 4096, 14336, 128, 1, DTYPE)),
                                           ("dequant", None)], args.rounds)
        for t, path, _ in ranked:
            log.append({"kernel": "crossover", "K": 4096, "N": 14336, "M": m, "passes": 1, "path": path, "us": t * 1e6})
        if ranked and ranked[0][1] == "mma":
            mma_max = m
        print(f"  crossover M{m}: {[(p, round(t * 1e6, 1)) for t, p, _ in ranked]}", file=sys.stderr, flush=True)
    entries.append({"kernel": "paths", "config": {"gemv_max_m": 1, "mma_max_m": mma_max}})
    write()
    with open(args.out.replace(".json", "") + "-log.json", "w") as f:
        json.dump({"device": device, "rows": log}, f, indent=1)
    print(json.dumps(entries, indent=None)[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
