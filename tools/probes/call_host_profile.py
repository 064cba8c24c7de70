"""Where one eager call's host time goes, by Python function: the ``overhead`` suite's
subjects (every quantcore kernel called directly and every module, beside ``nn.Linear``),
each call's host µs measured without a profiler, then the same calls under ``cProfile``
while a spin kernel holds the GPU (so no call waits for it) — the functions that take the
most time of their own, with calls and µs per call. cProfile adds about a microsecond per
Python function entered, so read its µs as shares, and the plain column as the cost.

    python -m tools.probes.call_host_profile --ms 1,16,128,1024 \\
        --names 'nvfp4|QuantExperts|turboquant_triton|TurboQuantLinear|nn.Linear' --json PATH
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import re
from pathlib import Path
from typing import Any

import torch

from quantcore.benchmarks.suites._host_cost import host_samples, subjects
from quantcore.dtypes import parse_dtype

#: Calls profiled per round, and the spin that holds the GPU while they are issued.
CALLS, ROUNDS, SPIN_CYCLES = 64, 8, 100_000_000


def _profile(fn: Any, device: torch.device, top: int) -> list[dict[str, Any]]:
    profiler = cProfile.Profile()
    for r in range(ROUNDS):
        if device.type == "cuda":
            torch.cuda._sleep(SPIN_CYCLES)
        profiler.enable()
        for i in range(CALLS):
            fn(r * CALLS + i)
        profiler.disable()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    calls = CALLS * ROUNDS
    rows = []
    for (path, line, func), (_, ncalls, tottime, cumtime, _) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        where = path.split("site-packages/")[-1].removeprefix(str(Path.cwd()) + "/")
        rows.append({"function": f"{where}:{line}({func})", "calls_per_call": ncalls / calls,
                     "own_us": tottime / calls * 1e6, "cum_us": cumtime / calls * 1e6})
    rows.sort(key=lambda row: -row["own_us"])
    return rows[:top]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ms", default="1,16,128,1024")
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--names", default=".", help="a regex over the subjects' names")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = parse_dtype(args.dtype)
    result: dict[str, Any] = {"device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                              "torch": torch.__version__, "k": args.k, "n": args.n, "dtype": args.dtype, "cases": []}
    for m in (int(v) for v in args.ms.split(",")):
        subs, skipped = subjects(device, dtype, m, args.k, args.n)
        subs = [s for s in subs if s.name == "nn.Linear" or re.search(args.names, s.name)]
        with torch.no_grad():
            plain = host_samples([s.fn for s in subs], device, rounds=5)
            for sub, samples in zip(subs, plain, strict=True):
                host_us = samples.timing().median_s * 1e6
                rows = _profile(sub.fn, device, args.top)
                result["cases"].append({"M": m, "name": sub.name, "host_us": host_us, "profile": rows})
                print(f"\n== M={m} {sub.name}: {host_us:.1f} µs host per call (no profiler)")
                for row in rows[:12]:
                    print(f"  {row['own_us']:7.2f} own {row['cum_us']:7.2f} cum  x{row['calls_per_call']:.0f}  "
                          f"{row['function']}")
        if skipped:
            print(f"skipped at M={m}: {skipped}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
