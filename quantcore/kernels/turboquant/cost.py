"""What one TurboQuant linear call moves, for the kernels' declared costs
(:mod:`quantcore.cost`): per pass the packed indices (two 4-bit codes a byte), one norm per
(row, group) and the rotation(s), then x read and y written once."""

from __future__ import annotations

from ...formats.turboquant import TurboQuant
from ...problem import Problem

__all__ = ["group_size", "passes", "rotation_flops", "weight_bytes"]


def passes(problem: Problem) -> int:
    fmt = problem.format
    return len(fmt.passes) if isinstance(fmt, TurboQuant) else 1


def group_size(problem: Problem) -> int:
    """d, the columns of a group (a TurboQuant problem's; 128 otherwise)."""
    fmt = problem.format
    return fmt.group_size if isinstance(fmt, TurboQuant) else 128


def weight_bytes(problem: Problem) -> float:
    """The stored weight of every pass: indices, norms, rotations (float32)."""
    fmt = problem.format
    k, n = problem["K"], problem["N"]
    if not isinstance(fmt, TurboQuant):
        return k * n / 2
    d = fmt.group_size
    per_pass = n * k / 2 + n * (k // d) * fmt.norm_dtype.itemsize + fmt.num_rotations(k) * d * d * 4
    return passes(problem) * per_pass


def rotation_flops(problem: Problem) -> float:
    """The input rotation of every pass: a ``[M, K] × [d, d]`` GEMM per group."""
    fmt = problem.format
    d = fmt.group_size if isinstance(fmt, TurboQuant) else 0
    return passes(problem) * 2 * problem["M"] * problem["K"] * d
