"""Where the host time of an offloaded TurboQuant forward goes (a developer's probe, CUDA).

The offload suite shows the prefetch chain hiding the copies when the GPU is the
bottleneck (large M) but not when the host is (small M). This traces one resident and
one offloaded forward of the suite's stack with ``torch.profiler`` and prints the host
calls by self CPU time, so a call that blocks the host on a copy stands out, and the
device's kernels and copies by their own time, so a kernel the offloaded path adds does too.

    python -m tools.probes.turboquant_offload_trace [--m 1] [--layers 8]
"""

from __future__ import annotations

import argparse
import copy

import torch
from torch.profiler import ProfilerActivity, profile

from quantcore.benchmarks.suites.turboquant_offload import stack
from quantcore.nn.turboquant.model import enable_pass2_offload


def trace(model: torch.nn.Module, x: torch.Tensor, label: str, rows: int) -> None:
    for _ in range(3):
        model(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model(x)
        torch.cuda.synchronize()
    print(f"\n=== {label}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))
    # The GPU side: which kernels and copies ran, how often and for how long.
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", type=int, default=18)
    args = ap.parse_args()
    resident = stack(args.k, args.layers, "cuda")
    offloaded = copy.deepcopy(resident)
    enable_pass2_offload(offloaded)
    x = torch.randn(args.m, args.k, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        trace(resident, x, f"resident, M={args.m}", args.rows)
        trace(offloaded, x, f"offloaded, M={args.m}", args.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
