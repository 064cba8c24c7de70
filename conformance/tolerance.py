"""The tolerance policy. It lives with the ops' golden references
(:mod:`quantcore.ops.tolerance`), which tuning shares; re-exported here for the tests and
plugins that judge their own outputs by the matrix's rules."""

from quantcore.ops.tolerance import (
    MAX_FACTOR,
    Comparison,
    Tolerance,
    compare,
    judge_output,
    tolerance_for,
)

__all__ = ["MAX_FACTOR", "Comparison", "Tolerance", "compare", "judge_output", "tolerance_for"]
