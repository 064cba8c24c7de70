"""What quantcore itself costs: the import, and get_kernel when its answer is cached.

Targets: ``import quantcore`` ≤ 0.5 s and no triton; cached ``get_kernel``
≤ 5 µs; ``aten_cpu`` through quantcore ≤ 3% over torch's raw op at M = 1. Import time is
measured as a fresh interpreter importing quantcore, against one that imports nothing
(the difference is quantcore's) and one importing torch. The call overhead is measured
where it can be seen: at a shape so small that the op takes microseconds, the difference
between the kernel and the raw op on the same prepared tensors is quantcore's per-call
cost; it is then set against the raw op's time at K = N = 4096.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import torch

from quantcore.formats.gptq import GPTQ
from quantcore.problem import Problem
from quantcore.selection import get_kernel

from ..spec import BenchCase, Variant
from . import gptq_linear

#: Never timed as a CUDA graph: it times subprocesses and host-side lookups.
GRAPH_SAFE = False
DESCRIPTION = "quantcore's own costs: import time and cached get_kernel"
SHAPES = {"default": [{"M": 1, "K": 4096, "N": 4096}]}
#: Where the per-call cost shows (the op takes microseconds), then the issue's decode shape.
DISPATCH_SHAPES = ({"M": 1, "K": 128, "N": 256}, {"M": 1, "K": 4096, "N": 4096})


def _python(code: str) -> Any:
    return lambda i: subprocess.run([sys.executable, "-c", code], check=True)


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    yield BenchCase("overhead", "import", {}, [
        Variant("import quantcore", "kernel", _python("import quantcore, sys; assert 'triton' not in sys.modules"), 0, 0),
        Variant("python -c pass", "peer", _python("pass"), 0, 0),
        Variant("import torch", "peer", _python("import torch"), 0, 0),
    ])
    dims = shapes[0]
    problem = Problem.linear(GPTQ(), M=dims["M"], K=dims["K"], N=dims["N"], dtype=torch.bfloat16)
    get_kernel("gptq", device, problem=problem)
    yield BenchCase("overhead", "get_kernel", dict(dims), [
        Variant("get_kernel (cached)", "kernel", lambda i: get_kernel("gptq", device, problem=problem), 0, 0),
        Variant("dict lookup", "peer", lambda i, d={problem: 1}: d[problem], 0, 0, note="hash of the Problem"),
    ])
    if device == "cpu":
        for d in DISPATCH_SHAPES:
            case = gptq_linear.linear_case(
                "overhead", gptq_linear.FMT, gptq_linear.DTYPE, dict(d), device, gptq_linear.weights,
                gptq_linear.int4_bytes(d["M"], d["K"], d["N"]), gptq_linear.raw_op_peer,
            )
            case.variants = [v for v in case.variants if v.name in ("aten_cpu", "aten_op_raw")]
            yield case


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    t = {(r["case"], r["variant"]): r["time_s"] for r in rows if r["role"] != "skipped"}
    own = t["import", "import quantcore"] - t["import", "python -c pass"]
    notes = [
        f"import quantcore: {own * 1e3:.1f} ms over a bare interpreter (target ≤ 500 ms; triton not imported)",
        f"get_kernel, cached: {t['get_kernel', 'get_kernel (cached)'] * 1e6:.2f} µs (target ≤ 5 µs)",
    ]
    small, large = ("M{M}-K{K}-N{N}".format(**d) for d in DISPATCH_SHAPES)
    if (small, "aten_cpu") in t and (large, "aten_op_raw") in t:
        per_call = t[small, "aten_cpu"] - t[small, "aten_op_raw"]
        notes.append(
            f"aten_cpu through quantcore: {per_call * 1e6:+.1f} µs per call over the raw op ({small}), "
            f"{100 * per_call / t[large, 'aten_op_raw']:+.2f}% of the raw op at {large} (target ≤ +3%)"
        )
    return notes
