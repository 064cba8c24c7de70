"""What a call through quantcore's custom op costs the host over the kernel's direct call,
and what a ``torch.compile``d module's call costs (the op inside a compiled graph): a small
GPTQ 4-bit ``QuantLinear`` on this CPU, its ``aten_cpu`` kernel (no GPU needed), best of
nine runs of ``--calls`` calls each.

    python -m tools.probes.custom_op_host_cost [--calls 3000] [--label NAME] [--json PATH]

Run it once per tree to compare two of them (``PYTHONPATH`` to the other tree's install).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

import quantcore
from quantcore.custom_ops.ops import call_op
from quantcore.formats.gptq import GPTQ


def _best_us(fn: Callable[[], object], calls: int) -> float:
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(9):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def measure(calls: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 128, bias=False))
    quantcore.quantize_(model, GPTQ(bits=4, group_size=128))
    layer = model[0]
    x = torch.randn(1, 128)
    spec, state = layer._spec, layer.state_tensors()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        compiled(x)
        direct = _best_us(lambda: layer.kernel(x, layer.prepared), calls)
        op = _best_us(lambda: call_op(layer.op.name, spec, state, x), calls)
        module = _best_us(lambda: compiled(x), calls)
    return {"kernel_direct_us": round(direct, 2), "through_op_us": round(op, 2),
            "compiled_module_us": round(module, 2), "op_over_direct_us": round(op - direct, 2),
            "compiled_over_direct_us": round(module - direct, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--json", type=Path, help="append the result to this JSON list")
    args = parser.parse_args()
    row = {"label": args.label, "torch": torch.__version__, **measure(args.calls)}
    print(json.dumps(row))
    if args.json:
        rows = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps([*rows, row], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
