"""Where should the tensor-core kernel of ``turboquant_triton`` rotate its input: by a GEMM
before it (two launches, the default), in every program of the kernel, or once per call
by the kernel's own first programs (one launch each)? A developer's probe, CUDA.

1. Correctness first: per (K, N, M), every variant's output against the default path's
   (bit-identical, or within the bf16 tolerance of the conformance matrix) and against
   the float64 golden output (relative error ≤ 2e-2); the variant rotating once is also
   called twice in a row (its counts reset: the same bits). A failure prints ``FAIL``,
   is not timed, and makes the exit status 1.
2. Device time: the tensor-core kernel with x rotated outside, inside and once (this
   card's configuration for the M bucket, else each variant's rule; from M = 64 also the
   rule's in-kernel tile, 8 warps and 2 stages), the wrapper's default, and cuBLAS bf16 on
   the same shape, timed as CUDA-graph replays over weight sets that together exceed L2,
   all in the same rounds.
3. Host time: µs per eager call at K = N = 4096 (``benchmarks/suites/_host_cost.py``'s
   timer: a queue of 64 calls issued, then one synchronisation) of the kernel's call with
   each variant and of ``nn.Linear``.

    python -m tools.probes.turboquant_rotation [--json PATH] [--rounds 5] [--ms 16 64 128]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from tabulate import tabulate

from quantcore.backends.turboquant_triton import configs, fused
from quantcore.backends.turboquant_triton.fused import fused_linear
from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
from quantcore.benchmarks.memory import rotation_sets
from quantcore.benchmarks.suites._host_cost import host_times
from quantcore.benchmarks.suites.turboquant_linear import format_bytes
from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.formats.turboquant import TurboQuant
from quantcore.probe.card_tables import card_of
from quantcore.timing import time_interleaved

from .turboquant_paths import _rel_error, _weights

DTYPE = torch.bfloat16
DEVICE = "cuda"
SHAPES = ((4096, 14336), (14336, 4096), (4096, 4096))
MS = (16, 64, 128)
HOST_MS = (16, 64, 128)
#: What each variant is called in the rows, by ``configs.mma_rotation``'s name for it.
VARIANT = {"outside": "outside", "kernel": "in-kernel", "once": "once"}
HOST_SHAPE = (4096, 4096)
#: The in-kernel tile the rule takes from M = 64 (configs.mma_config), beside the table's.
WIDE = {"warps": 8, "stages": 2}


def _variants(k: int, n: int, m: int) -> dict[str, configs.MmaConfig]:
    """The three variants on this card's table entry for the M bucket, else each on its
    rule's tile (the rotation once takes the outside variant's: its group loop is that
    one's); from M = 64 also the rule's in-kernel tile where the table's differs."""
    hit = configs.mma_entry(card_of(DEVICE), m, k, n, 128, 1, DTYPE)
    inside = dataclasses.replace(hit or configs.mma_rule(m, True), rotate_in_kernel=True, rotate_once=False)
    outside = dataclasses.replace(hit or configs.mma_rule(m, False), rotate_in_kernel=False, rotate_once=False)
    out = {"outside": outside, "in-kernel": inside, "once": dataclasses.replace(outside, rotate_once=True)}
    wide = dataclasses.replace(inside, block_m=64, **WIDE)
    if m >= 64 and wide != inside:
        out["in-kernel w8 s2"] = wide
    return out


def device_rows(k: int, n: int, m: int, rounds: int) -> list[dict[str, Any]]:
    fmt = TurboQuant(bits=4, group_size=128)
    nbytes = format_bytes(fmt, m, k, n)
    sets = rotation_sets(nbytes, DEVICE)
    weights = _weights(fmt, k, n, sets, DEVICE)
    kernel = TurboQuantTriton(fmt, DEVICE)
    prepared = [kernel.prepare(w, dtype=DTYPE) for w in weights]
    xs = [torch.randn(m, k, device=DEVICE, dtype=DTYPE) for _ in range(sets)]
    ref = xs[0].double() @ fmt.dequantize(weights[0]).T  # float64 golden, set 0
    dense = [torch.randn(n, k, device=DEVICE, dtype=DTYPE) for _ in range(rotation_sets(2 * k * n, DEVICE))]

    def mma(cfg: configs.MmaConfig) -> Callable[[int], torch.Tensor]:
        def run(i: int) -> torch.Tensor:
            p = prepared[i % sets]
            return fused_linear(xs[i % sets], p.passes, p.codebook, group_size=128, partial=None, bias=None,
                                out_dtype=DTYPE, path="mma", config=cfg)
        return run

    calls: dict[str, tuple[Callable[[int], Any], int, Any]] = {
        name: (mma(cfg), sets, cfg) for name, cfg in _variants(k, n, m).items()}
    calls["default"] = (lambda i: kernel(xs[i % sets], prepared[i % sets]), sets, None)
    calls["cuBLAS bf16"] = (lambda i: torch.nn.functional.linear(xs[i % sets], dense[i % len(dense)]), len(dense),
                            None)
    default = kernel(xs[0], prepared[0])  # the default path's bits, the reference of every variant
    rows, keep = [], {}
    for name, (fn, nsets, cfg) in calls.items():
        base = {"K": k, "N": n, "M": m, "variant": name, "config": dataclasses.asdict(cfg) if cfg else None}
        try:
            y = fn(0)
            again = fn(0) if name == "once" else y  # the counts reset by the first call: the same bits
            torch.cuda.synchronize()
        except Exception as exc:  # a variant that fails is a row, not the end of the probe
            rows.append({**base, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            _fail(base, rows[-1]["error"])
            continue
        if name == "cuBLAS bf16":
            keep[name] = (fn, nsets, base, 0.0, y)
            continue
        err = _rel_error(y, ref)
        same = torch.equal(y, default)
        versus = compare(y, default.to("cpu", torch.float64), tolerance_for(DTYPE))
        base = {**base, "bit_identical_to_default": same,
                "max_abs_diff_to_default": float((y.double() - default.double()).abs().max())}
        problem = ("" if err <= 2e-2 else f"relative error {err:.2e} to the float64 golden > 2e-2") or \
                  ("" if versus.ok else f"against the default path: {versus.problem}") or \
                  ("" if torch.equal(again, y) else "a second call gave other bits (counts not reset?)")
        if problem:
            rows.append({**base, "rel_error": err, "error": f"wrong result: {problem}"})
            _fail(base, problem)
            continue
        keep[name] = (fn, nsets, base, err, y)
    timings = time_interleaved([v[0] for v in keep.values()], DEVICE, rounds=rounds, graph=True,
                               sets=[v[1] for v in keep.values()])
    bf16 = dict(zip(keep, timings, strict=True)).get("cuBLAS bf16")
    for (name, (fn, _, base, err, y)), t in zip(keep.items(), timings, strict=True):
        if name != "cuBLAS bf16":  # again after the replays: the split-K tickets and counts were reset each launch
            after = fn(0)
            err = max(err, _rel_error(after, ref))
            if not torch.equal(after, y):
                _fail(base, "after the graph replays a call gave other bits than before them")
                base = {**base, "error": "other bits after the replays"}
        rows.append({**base, "us": t.median_s * 1e6, "spread": t.spread, "method": t.method, "rel_error": err,
                     "vs_bf16": bf16.median_s / t.median_s if bf16 else None})
    return rows


FAILURES: list[str] = []


def _fail(base: dict[str, Any], problem: str) -> None:
    line = f"FAIL K{base['K']} N{base['N']} M{base['M']} {base['variant']}: {problem}"
    FAILURES.append(line)
    print(line, file=sys.stderr, flush=True)


def host_rows(m: int) -> list[dict[str, Any]]:
    """µs per eager call at K = N = 4096: the kernel's call with each variant, nn.Linear."""
    k, n = HOST_SHAPE
    fmt = TurboQuant(bits=4, group_size=128)
    weights = _weights(fmt, k, n, 1, DEVICE)[0]
    kernel = TurboQuantTriton(fmt, DEVICE)
    x = torch.randn(m, k, device=DEVICE, dtype=DTYPE)
    fns: dict[str, Callable[[int], object]] = {}
    for where in configs.MMA_ROTATIONS:  # each state's bucket is made while its variant is forced
        prepared = kernel.prepare(weights, dtype=DTYPE)
        os.environ[configs.ROTATION_ENV] = where
        kernel(x, prepared)
        made = [b for b in fused.launch_state(prepared.codebook).values() if isinstance(b, fused._Mma)]
        assert made and all(b.rotation == where for b in made), where
        fns[f"turboquant_triton, rotation {VARIANT[where]}"] = lambda i, p=prepared: kernel(x, p)
    del os.environ[configs.ROTATION_ENV]
    linear = torch.nn.Linear(k, n, bias=False, device=DEVICE, dtype=DTYPE)
    fns["nn.Linear bf16"] = lambda i: linear(x)
    with torch.inference_mode():
        times = host_times(list(fns.values()), torch.device(DEVICE))
    dense = times[-1][0].median_s
    return [{"K": k, "N": n, "M": m, "variant": name, "host_us": t.median_s * 1e6, "spread": t.spread,
             "wall_us": wall * 1e6, "vs_linear": t.median_s / dense}
            for name, (t, wall) in zip(fns, times, strict=True)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--ms", type=int, nargs="*", default=list(MS), help="row counts of the device rows (none: skip them)")
    ap.add_argument("--host-ms", type=int, nargs="*", default=list(HOST_MS), help="row counts of the host rows (none: skip)")
    args = ap.parse_args()
    os.environ.pop(configs.ROTATION_ENV, None)  # each variant is chosen here
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "card": str(card_of(DEVICE)),
                           "rows": [], "host": []}

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)

    t0 = time.time()
    for k, n in SHAPES:  # correctness is checked (and failures reported) before each shape's timing
        for m in args.ms:
            out["rows"] += device_rows(k, n, m, args.rounds)
            print(f"  done K{k} N{n} M{m} at {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
            save()
    for m in args.host_ms:
        out["host"] += host_rows(m)
        save()
    def versus_default(r: dict[str, Any]) -> str:
        if "bit_identical_to_default" not in r:
            return ""
        return "identical" if r["bit_identical_to_default"] else f"max |Δ| {r['max_abs_diff_to_default']:.1e}"

    print(tabulate([[r["K"], r["N"], r["M"], r["variant"],
                     f"{r['us']:.1f} ±{100 * r['spread']:.0f}%" if "us" in r else r.get("error", ""),
                     f"{r['vs_bf16']:.2f}×" if r.get("vs_bf16") else "", f"{r.get('rel_error', 0):.1e}",
                     versus_default(r)]
                    for r in out["rows"]],
                   headers=["K", "N", "M", "variant", "µs (graph)", "vs bf16", "rel err", "vs default"]))
    print(tabulate([[r["M"], r["variant"], f"{r['host_us']:.1f}", f"{r['vs_linear']:.2f}×"] for r in out["host"]],
                   headers=["M", "eager call (K = N = 4096)", "host µs", "vs nn.Linear"]))
    out["failures"] = FAILURES
    save()
    for line in FAILURES:
        print(line)
    print(f"{len(FAILURES)} FAILURES" if FAILURES else "correctness: every variant passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    raise SystemExit(main())
