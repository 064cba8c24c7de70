"""Where the host time of an eager call of ``hopper_wgmma``'s TurboQuant kernel goes (an sm_90
GPU, one call): the whole call, then its steps alone on the same prepared layer — the bound
rotation launch, the code matrix's launch on rotated rows, the rotation as torch's GEMM —
beside ``nn.Linear``; host µs per call over a queue of calls issued while a spin kernel
holds the GPU (``benchmarks/suites/_host_cost.py``), and whether each bound launch took
Triton's plain path (``Launch.fallback``).

    python -m tools.probes.turboquant_hopper_host [--m 16] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from quantcore.backends.hopper_wgmma.launch import linear
from quantcore.backends.hopper_wgmma.turboquant import HopperWgmmaTurboQuant
from quantcore.backends.hopper_wgmma.turboquant_launch import layer_rotation
from quantcore.benchmarks.suites._host_cost import host_samples
from quantcore.formats.turboquant import TurboQuant


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev, dtype, k, n = torch.device("cuda"), torch.bfloat16, 4096, 4096
    fmt = TurboQuant()
    gen = torch.Generator().manual_seed(0)
    stored = {name: t.to(dev) for name, t in fmt.quantize(torch.randn(n, k, generator=gen) * 0.02,
                                                          generator=gen).items()}
    kernel = HopperWgmmaTurboQuant(fmt, dev)
    w = kernel.prepare(stored, dtype=dtype)
    x = torch.randn(args.m, k, device=dev).to(dtype)
    kernel(x, w)
    rotation = layer_rotation(w, dtype, dev)
    x_rot = rotation(x).view(args.m, w.in_features)
    dense = torch.nn.Linear(k, n, bias=False, device=dev, dtype=dtype)
    steps: dict[str, Any] = {
        "the kernel's call": lambda i: kernel(x, w),
        "rotation, bound launch": lambda i: rotation(x),
        "rotation, torch GEMM": lambda i: rotation.rotation(x),
        "code matrix launch (launch.linear)": lambda i: linear(x_rot, w),
        "nn.Linear": lambda i: dense(x),
    }
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "M": args.m, "K": k, "N": n,
                           "rotation_fallback": {bm: launch.fallback for bm, launch in rotation.launches.items()},
                           "rows": []}
    for name, samples in zip(steps, host_samples(list(steps.values()), dev), strict=True):
        held = sorted(samples.held)
        us = held[len(held) // 2] * 1e6
        out["rows"].append({"step": name, "host_us_device_held": us, "samples_s": list(samples.held)})
        print(f"{name:40s} {us:7.1f} µs", flush=True)
    print("rotation launch fallback:", out["rotation_fallback"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
