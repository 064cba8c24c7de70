"""Which plan a call runs: the tuned table of this card (or the nearest tuned card of the
same architecture), else a rule.

Tables are keyed by :class:`quantcore.probe.card.CardKey` — architecture, SMs, shared
memory per block, bandwidth class — not by a device name, so an H100 NVL finds the H100
SXM table and an H200 its own. Within a table the key is ``(bits, K, N, M)``; a call takes
the plan of the largest measured M at or below its own (at most 4× below), else the rule.
A shape the card's own table did not measure (a table may cover only what one device
call timed) is looked up in the next nearest table.
fp16 takes the bf16 plans (the same tiles and instruction counts). On the H100 and the
H200 a first call compiles one kernel and times nothing; on an sm_90 card without a table
of its own, a model-sized layer's first call times a few plans and caches the fastest
(``first_use.py``).
"""

from __future__ import annotations

from quantcore.kernels.gptq_pairs.plans import Shape, pow2_at_least
from quantcore.probe.card import CardKey

from .plans import AnyPlan, Plan

__all__ = ["SMEM_RESERVE", "Shape", "default_plan", "has_table", "measured_here", "plan_for"]

#: Shared memory a CTA keeps for the epilogue's layout conversion and the barriers, beyond
#: the ring (bytes).
SMEM_RESERVE = 8 * 1024


def default_plan(shape: Shape, card: CardKey) -> Plan:
    """A rule for cards and shapes without a table, read off the H200 table: while the
    weight's bytes bound the call (M ≤ 64), one warpgroup, the smallest activation tile,
    a deep ring and K split to about three CTAs per SM; one warpgroup of 128 rows up to
    M = 128; above, two warpgroups and 256-row tiles (128 at 8 bits, whose fp32 detour
    would spill), K split only while the tiles alone cannot fill the SMs."""
    m, bits = shape.m, shape.bits
    blocks = shape.blocks
    tiles_n = -(-shape.n // 64)
    if m <= 64:
        bm = pow2_at_least(m, 8, 64)
        wg, stages, per_sm = 1, 8 if bm <= 32 else 5, 3
    elif m <= 128:
        wg, bm, stages, per_sm = 1, 128, 4, 1
    else:
        wg, bm, stages, per_sm = 2, 128 if bits == 8 else 256, 4 if bits == 8 else 3, 1
    tiles = -(-tiles_n // wg) * -(-m // bm)
    split = max(1, min(blocks // 2 or 1, round(per_sm * card.sms / tiles)))
    return Plan(wg, bm, stages, split)


def _tables() -> dict[CardKey, dict[tuple[int, int, int, int], AnyPlan]]:
    from .tuned import load_tables

    return load_tables()


def has_table(card: CardKey) -> bool:
    """Whether a table measured on ``card`` itself ships (not only a nearer card's)."""
    return card in _tables()


def _nearest_first(card: CardKey, keys: list[CardKey]) -> list[CardKey]:
    """``keys`` of ``card``'s architecture, this card's own first, then by nearness."""
    left, order = list(keys), []
    while (key := card.nearest(left)) is not None:
        order.append(key)
        left.remove(key)
    return order


def _measured(table: dict[tuple[int, int, int, int], AnyPlan], shape: Shape) -> tuple[bool, AnyPlan | None]:
    """Whether ``table`` measured this (bits, K, N), and its plan for the call: the one of its
    largest M at or below the call's, at most 4× below (None where there is none)."""
    ms = sorted(m for (b, k, n, m) in table if (b, k, n) == (shape.bits, shape.k, shape.n))
    below = [m for m in ms if m <= shape.m]
    hit = below and shape.m <= 4 * below[-1]
    return bool(ms), table[(shape.bits, shape.k, shape.n, below[-1])] if hit else None


def plan_for(shape: Shape, card: CardKey) -> AnyPlan:
    """The plan of the nearest table that measured this (bits, K, N) — the card's own
    first — at the largest M at or below the call's (at most 4× below); else the rule."""
    tables = _tables()
    for key in _nearest_first(card, list(tables)):
        measured, plan = _measured(tables[key], shape)
        if measured:  # else this table did not measure the shape: ask the next one
            return plan if plan is not None else default_plan(shape, card)
    return default_plan(shape, card)


def measured_here(shape: Shape, card: CardKey) -> bool:
    """Whether ``card``'s own table has a plan for ``shape`` (not a nearer card's, not the rule)."""
    table = _tables().get(card)
    return table is not None and _measured(table, shape)[1] is not None
