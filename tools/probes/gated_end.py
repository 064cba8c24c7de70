"""A fused gate/up layer's call ending with ``silu(gate) · up`` (``hopper_wgmma``'s gated end,
``quantcore/triton/gluon_split_k.py``) against the layer's call followed by
``gated_activation``'s launch, on an sm_90 GPU: CUDA-graph replay µs of each (interleaved
rounds, ``quantcore/timing.py``), eager host µs per call with the device held
(``benchmarks/suites/_host_cost.py``) beside ``nn.Linear`` of the same shape, and whether the
two give the same bits. GPTQ 4-bit g128 sym, bf16.

    python -m tools.probes.gated_end [--shapes 8192x14336,8192x28672] [--ms 1,16,64] [--json PATH]
    ncu --launch-skip 4 --launch-count 6 -k regex:kernel python -m tools.probes.gated_end --profile ...

A shape is ``KxI``: the layer is ``[2·I, K]`` (gate's I rows, then up's). The gated launch is
timed through ``launch.gated_linear`` (the kernel's ``gated`` declines a capture). ``--profile``
only launches, for a profiler: per shape and M, each way twice (compiles, binds), then the
layer's launch three times and the gated one three times.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from benchmarks.suites._host_cost import host_samples
from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.launch import gated_linear, launch_state
from quantcore.formats.gptq import GPTQ
from quantcore.kernels.gated_activation import gated_activation
from quantcore.timing import time_interleaved


def _plans(w: Any, m: int) -> tuple[str, str | None]:
    """The plan of a plain call of ``m`` rows, and the plan its gated call ended gated with
    (None: the two launches)."""
    for runs in launch_state(w.qweight).values():
        if isinstance(runs, dict) and m in runs:
            twin = runs[m].gated
            return repr(runs[m].plan), repr(twin.plan) if twin else None
    return "?", None


def _shape_rows(kernel: HopperWgmmaGPTQ, k: int, inter: int, ms: list[int], profile: bool) -> list[dict[str, Any]]:
    dev, dtype = torch.device("cuda"), torch.bfloat16
    gen = torch.Generator().manual_seed(k + inter)
    stored = kernel.fmt.quantize(torch.randn(2 * inter, k, generator=gen) * 0.02, generator=gen)
    w = kernel.prepare({a: t.to(dev) for a, t in stored.items()}, dtype=dtype)
    dense = torch.nn.Linear(k, 2 * inter, bias=False, device=dev, dtype=dtype)
    rows = []
    for m in ms:
        xs = [torch.randn(m, k, device=dev).to(dtype) for _ in range(4)]

        def two(i: int, xs: list[torch.Tensor] = xs) -> torch.Tensor:
            return gated_activation(kernel(xs[i % 4], w), "silu")

        def one(i: int, xs: list[torch.Tensor] = xs) -> torch.Tensor:
            return gated_linear(xs[i % 4], w)

        def linear(i: int, xs: list[torch.Tensor] = xs) -> torch.Tensor:
            return dense(xs[i % 4])

        if profile:
            for fn in (kernel, gated_linear, kernel, gated_linear, *[kernel] * 3, *[gated_linear] * 3):
                fn(xs[0], w)
            torch.cuda.synchronize()
            continue
        fused = one(0)
        plan, gated_plan = _plans(w, m)
        row: dict[str, Any] = {"K": k, "I": inter, "M": m, "plan": plan, "gated_plan": gated_plan,
                               "gated": gated_plan is not None, "same_bits": torch.equal(fused, two(0))}
        graph = time_interleaved([two, one], "cuda", rounds=7, graph=True, sets=[4, 4])
        row["graph_us"] = {"two launches": graph[0].median_s * 1e6, "gated": graph[1].median_s * 1e6}
        host = host_samples([two, one, linear], dev)
        row["host_us_device_held"] = {
            name: sorted(s.held)[len(s.held) // 2] * 1e6
            for name, s in zip(("two launches", "gated", "nn.Linear"), host, strict=True)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8192x14336,8192x28672,4096x14336")
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--json")
    ap.add_argument("--profile", action="store_true", help="only launch, for a profiler (module docstring)")
    args = ap.parse_args()
    kernel = HopperWgmmaGPTQ(GPTQ(bits=4, group_size=128), torch.device("cuda"))
    rows: list[dict[str, Any]] = []
    for shape in args.shapes.split(","):
        k, inter = (int(v) for v in shape.split("x"))
        rows += _shape_rows(kernel, k, inter, [int(v) for v in args.ms.split(",")], args.profile)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
