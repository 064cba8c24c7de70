"""On a machine without a GPU, Triton kernels can run only under Triton's interpreter.

The matrix turns the interpreter on for CPU runs so the same Triton source is checked
in CI (docs/triton-interpreter.md); it must be set before triton is first imported.
A user who set ``TRITON_INTERPRET`` themselves keeps their choice.
"""

from __future__ import annotations

import os
import sys

__all__ = ["enable_interpreter_for"]


def enable_interpreter_for(device: str) -> bool:
    """Set ``TRITON_INTERPRET=1`` for a CPU run if nobody chose otherwise. Returns
    whether the interpreter is on."""
    if str(device).split(":")[0] == "cpu" and "TRITON_INTERPRET" not in os.environ:
        if "triton" in sys.modules:
            return False  # too late: triton read the variable at import
        os.environ["TRITON_INTERPRET"] = "1"
        from quantcore.probe import clear_cache

        clear_cache()
    return os.environ.get("TRITON_INTERPRET") == "1"
