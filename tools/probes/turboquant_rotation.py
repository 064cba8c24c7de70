"""Where should the tensor-core kernel of ``turboquant_triton`` rotate its input: in the
kernel (one launch a call) or by a GEMM before it (two)? A developer's probe, CUDA.

1. Device time: per (K, N, M), the tensor-core kernel with x rotated outside and inside
   (this card's configuration for the M bucket; from M = 64 also the rule's in-kernel tile,
   8 warps and 2 stages), the wrapper's default, and cuBLAS bf16 on the same shape — each
   checked against the float64 golden output, then timed as CUDA-graph replays over
   weight sets that together exceed L2, all in the same rounds.
2. Host time: µs per eager call at K = N = 4096 (``benchmarks/suites/_host_cost.py``'s
   timer: a queue of 64 calls issued, then one synchronisation) of the kernel's call with
   each variant and of ``nn.Linear``.

    python -m tools.probes.turboquant_rotation [--json PATH] [--rounds 5]
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
from quantcore.formats.turboquant import TurboQuant
from quantcore.probe.card_tables import card_of
from quantcore.timing import time_interleaved

from .turboquant_paths import _rel_error, _weights

DTYPE = torch.bfloat16
DEVICE = "cuda"
SHAPES = ((4096, 14336), (14336, 4096))
MS = (1, 16, 64, 128)
HOST_MS = (16, 128)
HOST_SHAPE = (4096, 4096)
#: The in-kernel tile the rule takes from M = 64 (configs.mma_config), beside the table's.
WIDE = {"warps": 8, "stages": 2}


def _variants(k: int, n: int, m: int) -> dict[str, configs.MmaConfig]:
    """Both variants on this card's table entry for the M bucket, else each on its rule's
    tile; from M = 64 also the rule's in-kernel tile where the table's differs."""
    hit = configs.mma_entry(card_of(DEVICE), m, k, n, 128, 1, DTYPE)
    inside = dataclasses.replace(hit or configs.mma_rule(m, True), rotate_in_kernel=True)
    out = {"outside": dataclasses.replace(hit or configs.mma_rule(m, False), rotate_in_kernel=False),
           "in-kernel": inside}
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
    rows, keep = [], {}
    for name, (fn, nsets, cfg) in calls.items():
        base = {"K": k, "N": n, "M": m, "variant": name, "config": dataclasses.asdict(cfg) if cfg else None}
        try:
            y = fn(0)
            torch.cuda.synchronize()
        except Exception as exc:  # a variant that fails is a row, not the end of the probe
            rows.append({**base, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            continue
        err = _rel_error(y, ref) if name != "cuBLAS bf16" else 0.0
        if err > 2e-2:
            rows.append({**base, "rel_error": err, "error": "wrong result"})
            continue
        keep[name] = (fn, nsets, base, err)
    timings = time_interleaved([v[0] for v in keep.values()], DEVICE, rounds=rounds, graph=True,
                               sets=[v[1] for v in keep.values()])
    bf16 = dict(zip(keep, timings, strict=True)).get("cuBLAS bf16")
    for (name, (fn, _, base, err)), t in zip(keep.items(), timings, strict=True):
        if name != "cuBLAS bf16":  # again after the replays: the split-K tickets were reset each launch
            err = max(err, _rel_error(fn(0), ref))
        rows.append({**base, "us": t.median_s * 1e6, "spread": t.spread, "method": t.method, "rel_error": err,
                     "vs_bf16": bf16.median_s / t.median_s if bf16 else None})
    return rows


def host_rows(m: int) -> list[dict[str, Any]]:
    """µs per eager call at K = N = 4096: the kernel's call with each variant, nn.Linear."""
    k, n = HOST_SHAPE
    fmt = TurboQuant(bits=4, group_size=128)
    weights = _weights(fmt, k, n, 1, DEVICE)[0]
    kernel = TurboQuantTriton(fmt, DEVICE)
    x = torch.randn(m, k, device=DEVICE, dtype=DTYPE)
    fns: dict[str, Callable[[int], object]] = {}
    for where in ("outside", "kernel"):  # each state's bucket is made while its variant is forced
        prepared = kernel.prepare(weights, dtype=DTYPE)
        os.environ[configs.ROTATION_ENV] = where
        kernel(x, prepared)
        made = [b for b in fused.launch_state(prepared.codebook).values() if isinstance(b, fused._Mma)]
        assert made and all(b.in_kernel == (where == "kernel") for b in made), where
        fns[f"turboquant_triton, rotation {where}"] = lambda i, p=prepared: kernel(x, p)
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
    args = ap.parse_args()
    os.environ.pop(configs.ROTATION_ENV, None)  # each variant is chosen here
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "card": str(card_of(DEVICE)),
                           "rows": [], "host": []}

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)

    t0 = time.time()
    for m in HOST_MS:
        out["host"] += host_rows(m)
        save()
    for k, n in SHAPES:
        for m in MS:
            out["rows"] += device_rows(k, n, m, args.rounds)
            print(f"  done K{k} N{n} M{m} at {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
            save()
    print(tabulate([[r["K"], r["N"], r["M"], r["variant"],
                     f"{r['us']:.1f} ±{100 * r['spread']:.0f}%" if "us" in r else r.get("error", ""),
                     f"{r['vs_bf16']:.2f}×" if r.get("vs_bf16") else "", f"{r.get('rel_error', 0):.1e}"]
                    for r in out["rows"]], headers=["K", "N", "M", "variant", "µs (graph)", "vs bf16", "rel err"]))
    print(tabulate([[r["M"], r["variant"], f"{r['host_us']:.1f}", f"{r['vs_linear']:.2f}×"] for r in out["host"]],
                   headers=["M", "eager call (K = N = 4096)", "host µs", "vs nn.Linear"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
