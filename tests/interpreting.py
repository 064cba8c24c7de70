"""Whether this test session runs Triton under its interpreter.

The quantcore pytest plugin decides it once, before collection
(``conformance/pytest_plugin.py``: on for CPU cells, never for a GPU session's default
device). A test module only reads the decision: one that turned the interpreter on when
imported would run every compiled kernel of the rest of a GPU session, inductor's too, on
the host (``tests/core/test_interpreter_choice.py`` keeps it so).
"""

from __future__ import annotations

import os

__all__ = ["INTERPRETER", "NOT_INTERPRETED"]

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
#: The skip reason of a module that runs Triton's kernels under the interpreter only.
NOT_INTERPRETED = "Triton's interpreter is off in this session (a GPU session runs the compiled kernels)"
