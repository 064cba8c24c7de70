"""``hopper_wgmma``'s TurboQuant call with the rotation in the code matrix's launch against
the rotation's own launch before it (``backends/hopper_wgmma/rotation_programs.py``; both
forced, in captures too: ``turboquant_launch.ROTATION_IN_LAUNCH``), on an sm_90 GPU: for each shape, format (one pass, two) and M of the decode plans, both outputs
against each other (how many values differ, by how much) and against the format's float64
golden (the conformance verdict), then the CUDA-graph replay µs of both beside cuBLAS bf16
on the dequantized weight, and the eager host µs of both beside ``nn.Linear`` (a queue
issued while a spin kernel holds the GPU: ``benchmarks/suites/_host_cost.py``).

    python -m tools.probes.turboquant_hopper_rotation [--shapes 4096x14336,...] [--ms 1,8] [--direct] [--json PATH]

``--direct``: the rotation programs load their operands straight into registers
(``turboquant_launch.ROTATION_DIRECT_LOADS``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from quantcore.backends.hopper_wgmma import turboquant_launch
from quantcore.backends.hopper_wgmma.turboquant import HopperWgmmaTurboQuant
from quantcore.benchmarks.suites._host_cost import host_samples
from quantcore.formats.turboquant import TurboQuant
from quantcore.ops.tolerance import compare, tolerance_for
from quantcore.timing import time_interleaved


def _call(kernel: Any, x: torch.Tensor, w: Any, fused: bool) -> torch.Tensor:
    """One call with the rotation in the launch (captures too) or by its own launch."""
    turboquant_launch.ROTATION_IN_LAUNCH = "always" if fused else "never"
    try:
        return kernel(x, w)  # type: ignore[no-any-return]
    finally:
        turboquant_launch.ROTATION_IN_LAUNCH = "eager"


def _case(fmt: TurboQuant, k: int, n: int, ms: list[int], dtypes: list[torch.dtype]) -> list[dict[str, Any]]:
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(k + n)
    stored = {name: t.to(dev) for name, t in fmt.quantize(torch.randn(n, k, generator=gen) * 0.02,
                                                          generator=gen).items()}
    w64 = fmt.dequantize(stored)
    rows = []
    for dtype in dtypes:
        kernel = HopperWgmmaTurboQuant(fmt, dev)
        w = kernel.prepare(stored, dtype=dtype)
        dense = torch.nn.Linear(k, n, bias=False, device=dev, dtype=dtype)
        with torch.no_grad():
            dense.weight.copy_(w64.to(dtype))
        for m in ms:
            x = torch.randn(m, k, device=dev).to(dtype)
            fused, apart = _call(kernel, x, w, True), _call(kernel, x, w, False)
            again = _call(kernel, x, w, True)
            golden = (x.double() @ w64.t()).cpu()
            diff = (fused.float() - apart.float()).abs()
            row: dict[str, Any] = {
                "format": fmt.slug, "K": k, "N": n, "M": m, "dtype": str(dtype).removeprefix("torch."),
                "fused_repeatable": bool(torch.equal(fused, again)),
                "values_differing": int((fused != apart).sum()), "max_abs_diff": float(diff.max()),
                "fused_verdict": compare(fused, golden, tolerance_for(dtype)).ok,
                "apart_verdict": compare(apart, golden, tolerance_for(dtype)).ok,
                "fused_rel_err": float((fused.double().cpu() - golden).norm() / golden.norm()),
                "apart_rel_err": float((apart.double().cpu() - golden).norm() / golden.norm()),
            }
            if dtype == torch.bfloat16:
                fns = [lambda i, k=kernel, x=x, w=w: _call(k, x, w, True),
                       lambda i, k=kernel, x=x, w=w: _call(k, x, w, False), lambda i, d=dense, x=x: d(x)]
                graph = time_interleaved(fns, "cuda", graph=True)
                row.update(graph_us_fused=graph[0].median_s * 1e6, graph_us_apart=graph[1].median_s * 1e6,
                           graph_us_cublas=graph[2].median_s * 1e6)
                held = [sorted(s.held)[len(s.held) // 2] * 1e6 for s in host_samples(fns, dev)]
                row.update(host_us_fused=held[0], host_us_apart=held[1], host_us_nn_linear=held[2])
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x14336,14336x4096,4096x4096")
    ap.add_argument("--ms", default="1,4,8")
    ap.add_argument("--fp16", action="store_true", help="also fp16 (correctness only)")
    ap.add_argument("--direct", action="store_true", help="operands loaded straight into registers")
    ap.add_argument("--json")
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    dtypes = [torch.bfloat16, torch.float16] if args.fp16 else [torch.bfloat16]
    turboquant_launch.ROTATION_DIRECT_LOADS = args.direct
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "direct_loads": args.direct, "rows": []}
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        for fmt in (TurboQuant(), TurboQuant(residual=True)):
            out["rows"] += _case(fmt, k, n, ms, dtypes)
            if args.json:  # after every case: a call stopped at its time limit keeps what it measured
                Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
