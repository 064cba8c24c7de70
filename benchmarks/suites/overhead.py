"""What quantcore itself costs: the import, and get_kernel when its answer is cached.

Targets (issue 2): ``import quantcore`` ≤ 0.5 s and no triton; cached ``get_kernel``
≤ 5 µs. Import time is measured as a fresh interpreter importing quantcore, against one
that imports nothing (the difference is quantcore's) and one importing torch.
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

#: Never timed as a CUDA graph: it times subprocesses and host-side lookups.
GRAPH_SAFE = False
DESCRIPTION = "quantcore's own costs: import time and cached get_kernel"
SHAPES = {"default": [{"M": 1, "K": 4096, "N": 4096}]}


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


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    t = {r["variant"]: r["time_s"] for r in rows}
    own = t["import quantcore"] - t["python -c pass"]
    return [
        f"import quantcore: {own * 1e3:.1f} ms over a bare interpreter (target ≤ 500 ms; triton not imported)",
        f"get_kernel, cached: {t['get_kernel (cached)'] * 1e6:.2f} µs (target ≤ 5 µs)",
    ]
