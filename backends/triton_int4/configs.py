"""Which path and tile a call runs: the shipped tuned table, else a default rule.

A plan is chosen from the problem alone (no autotuning at run time, so the first call
costs one compile, not a search): ``plan_for(shape, card)``, once per run of M between two
of :func:`plan_breaks` (``launch.py`` keeps it with the weight). The key
holds everything that changes a kernel's geometry: bits, the close-run of the groups
(``CLOSE`` slices), K, N and M. Tables are keyed by the card's features
(:class:`~quantcore.probe.card.CardKey`): the one shipped (``tuned_h100.py``) was measured
on an H100 (``tools/probes/triton_int4_tiles.py``; numbers in README.md) and serves every
sm_90 card without a table of its own (the nearest of the architecture,
:mod:`quantcore.probe.card_tables`); other architectures, and shapes missing from the
table, take :func:`default_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantcore.kernels.gptq_pairs.plans import Shape as PairedShape
from quantcore.kernels.gptq_pairs.plans import pow2_at_least
from quantcore.probe.card import CardKey
from quantcore.probe.card_tables import table_for

from .plans import GemvConfig, MmaConfig, Plan

__all__ = [
    "DEQUANT_BLOCK_N",
    "INTERPRETER_MMA",
    "GemvConfig",
    "MmaConfig",
    "Plan",
    "Shape",
    "default_plan",
    "plan_breaks",
    "plan_for",
]


@dataclass(frozen=True)
class Shape(PairedShape):
    """What a plan depends on: the shape (:class:`~quantcore.kernels.gptq_pairs.plans.Shape`),
    the groups and the activation dtype."""

    close: int  # slices per scale group (quantcore/kernels/gptq_pairs/triton_kernels.py)
    dtype: str  # "bf16" / "fp16"


#: Fixed tiles under the interpreter: few, large programs (it pays per operation).
INTERPRETER_MMA = MmaConfig(block_n=64, block_m=64, num_warps=4, num_stages=1, operand=0)
DEQUANT_BLOCK_N = 64


def _tuned() -> dict[CardKey, dict[tuple[int, int, int, int, int], Plan]]:
    """card → {(bits, close, K, N, M): plan}, measured in bf16 (tuned_h100.py)."""
    from . import tuned_h100

    return {tuned_h100.CARD: tuned_h100.PLANS}


def _split(blocks: int, tiles: int, target: int) -> int:
    """K splits that bring the programs near ``target``, each keeping at least one block."""
    return max(1, min(blocks, round(target / tiles)))


def default_plan(shape: Shape, sms: int) -> Plan:
    """A rule for shapes the table lacks, read off the H100 sweep (README.md): tensor
    cores at every M (fewer instructions per code than the CUDA-core GEMV); 64 outputs
    per program and K split to about 4 programs per SM up to M = 64, 128-row tiles above
    with less splitting; fused 128×128 tiles to M = 1024, then dequantize + cuBLAS."""
    m, blocks = shape.m, shape.blocks
    if m > 1024:
        return Plan("dequant")
    if m > 256:
        return Plan("mma", mma=MmaConfig(128, 128, 1, 8, 3, 1))
    block_m = pow2_at_least(m, 16, 128)
    block_b = 2 if blocks >= 16 and m <= 64 else 1
    tiles = -(-shape.n // 64) * -(-m // block_m)
    target = (4 if m <= 16 else 3 if m <= 64 else 2) * sms
    split = _split(blocks // block_b, tiles, target)
    return Plan("mma", mma=MmaConfig(64, block_m, split, 4, 3, 1, block_b))


#: The Ms at which :func:`default_plan` changes: its tile heights, split targets and paths.
DEFAULT_BREAKS = (17, 33, 65, 129, 257, 1025)


def plan_breaks(shape: Shape, card: CardKey) -> tuple[int, ...]:
    """The Ms (increasing) at which :func:`plan_for` may answer differently for this
    shape's K, N, bits and close (its M is ignored): those of the rule, and for a measured
    shape each measured M and the first M more than 4× above it. Between two breaks the
    plan is one: a launcher decides it once per run of M (``launch.py``)."""
    table = table_for(_tuned(), card) or {}
    ms = [m for (b, c, k, n, m) in table if (b, c, k, n) == (shape.bits, shape.close, shape.k, shape.n)]
    return tuple(sorted({*DEFAULT_BREAKS, *ms, *(4 * m + 1 for m in ms)}))


def plan_for(shape: Shape, card: CardKey) -> Plan:
    """The measured plan of the largest measured M at or below this one (at most 4× below:
    further out, the rule), for this card's table (or the nearest of its architecture),
    bits, groups, K and N; else the rule. fp16 takes the bf16 measurement: the same tiles
    and, per the sm90 report, the same instruction counts."""
    table = table_for(_tuned(), card)
    if table:
        ms = sorted(m for (b, c, k, n, m) in table if (b, c, k, n) == (shape.bits, shape.close, shape.k, shape.n))
        below = [m for m in ms if m <= shape.m]
        if below and shape.m <= 4 * below[-1]:
            return table[(shape.bits, shape.close, shape.k, shape.n, below[-1])]
    return default_plan(shape, card.sms)
