"""Is the offloaded TurboQuant forward bound by the host or by its copies? (a developer's
probe, CUDA).

For each M, times resident and offloaded forwards of the offload suite's stack two ways:
the host's issue time (the loop without a final sync) and the wall time (with it). Where
they are equal the forward is host-bound. Then one offloaded forward runs under torch's
sync debug mode, which raises on any call that synchronizes the host with the GPU.

    python -m tools.probes.turboquant_offload_host [--layers 8] [--reps 20]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from quantcore.benchmarks.suites.turboquant_offload import stack
from quantcore.nn.turboquant.model import enable_pass2_offload


def issue_and_wall(model: torch.nn.Module, x: torch.Tensor, reps: int) -> tuple[float, float]:
    for _ in range(3):
        model(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        model(x)
    issued = time.perf_counter() - t0
    torch.cuda.synchronize()
    return issued / reps, (time.perf_counter() - t0) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    resident = stack(4096, args.layers, "cuda")
    offloaded = copy.deepcopy(resident)
    enable_pass2_offload(offloaded)
    print(f"{torch.cuda.get_device_name()}, K = N = 4096, {args.layers} layers, bf16")
    with torch.no_grad():
        for m in (1, 128, 2048):
            x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
            for label, model in (("resident", resident), ("offload", offloaded)):
                issued, wall = issue_and_wall(model, x, args.reps)
                print(f"M={m:<5} {label:9s} host issue {issued * 1e6:7.0f} us   wall {wall * 1e6:7.0f} us")
        torch.cuda.set_sync_debug_mode("error")
        try:
            offloaded(x)
            print("sync debug mode: no call in the offloaded forward synchronizes the host")
        except RuntimeError as exc:
            print(f"sync debug mode: {exc}")
        finally:
            torch.cuda.set_sync_debug_mode("default")


if __name__ == "__main__":
    main()
