"""What the compiler makes of each Triton kernel of the repository for Hopper (sm_90a), on
any machine, no GPU needed: registers, spill stack, shared memory, and SASS instruction
counts of the main loop (:mod:`quantcore.triton.compile_report` does the compiling and
the counting; a module here per kernel says what to compile and what to count)::

    python -m tools.compile_report KERNEL [--sass DIR] [--all]

prints one JSON list of rows. ``tests/*/test_sm90_compile.py`` hold the rows to their
budgets (no spills, within an H100 block's shared memory, instructions per weight).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

__all__ = ["KERNELS", "report"]

#: Kernel name -> the module (here) that reports it.
KERNELS = {
    "act_quant_lora": "act_quant_lora",
    "gated_activation": "gated_activation",
    "triton_int4": "triton_int4",
    "trtllm_moe_triton": "trtllm_moe_triton",
    "turboquant_triton": "turboquant_triton",
}


def report(kernel: str, *, sass_dir: Path | None = None, everything: bool = False) -> list[dict[str, Any]]:
    """The rows of one kernel; ``sass_dir`` also keeps each variant's SASS there;
    ``everything`` adds the variants a kernel reports only on request."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {sorted(KERNELS)}, got {kernel!r}")
    module = importlib.import_module(f"{__name__}.{KERNELS[kernel]}")
    if sass_dir is not None:
        sass_dir.mkdir(parents=True, exist_ok=True)
    return module.report(sass_dir=sass_dir, everything=everything)  # type: ignore[no-any-return]
