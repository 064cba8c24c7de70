"""What one routed MoE GEMM moves, for the kernels' declared costs (:mod:`quantcore.cost`):
the int8 weight of every expert the tokens touch, its scales (one per group of K rows and
column), the activation of every route read and the output of every route written."""

from __future__ import annotations

from ...problem import Problem

__all__ = ["moe_bytes", "moe_flops", "touched_experts"]


def touched_experts(problem: Problem) -> int:
    """Experts a batch of T tokens reaches at most (spread routing: all of them soon)."""
    return min(problem["E"], problem["T"] * problem["topk"])


def moe_bytes(problem: Problem, *, per_weight: float = 1.0) -> float:
    """``per_weight`` bytes per touched weight element (1: the int8 codes read once)."""
    t, topk, k, n = problem["T"], problem["topk"], problem["K"], problem["N"]
    group = getattr(problem.format, "group_size", 128)
    scale = getattr(problem.format, "scale_dtype", None)
    scale_bytes = scale.itemsize if scale is not None else 2
    act = problem.act_dtype.itemsize
    return touched_experts(problem) * (per_weight * k * n + scale_bytes * (k // max(1, group)) * n) + act * (
        t * k + t * topk * n)


def moe_flops(problem: Problem) -> float:
    return 2 * problem["T"] * problem["topk"] * problem["K"] * problem["N"]
