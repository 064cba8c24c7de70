"""Which plan a call runs: the tuned table of this card (or the nearest tuned card of the
same architecture), else a rule.

Tables are keyed by :class:`quantcore.probe.card.CardKey` — architecture, SMs, shared
memory per block, bandwidth class — not by a device name, so an H100 NVL finds the H100
SXM table and an H200 its own. Within a table the key is ``(bits, K, N, M)``; a call takes
the plan of the largest measured M at or below its own (at most 4× below) if that plan's
activation tile holds the call's rows. A plan tuned for 16 rows would read the weight
four times at 64, so a call whose M the shape's table rows do not serve takes the plan of
the nearest measured shape at its M (split re-fitted to the same CTA count), else the rule.
A shape the card's own table did not measure (a table may cover only what one device
call timed) is looked up in the next nearest table.
fp16 takes the bf16 plans (the same tiles and instruction counts). On the H100 and the
H200 a first call compiles one kernel and times nothing; on an sm_90 card without a table
of its own, a model-sized layer's first call times a few plans and caches the fastest
(``first_use.py``).
"""

from __future__ import annotations

import dataclasses
import math

from quantcore.kernels.gptq_pairs.plans import Shape, pow2_at_least
from quantcore.probe.card import CardKey

from .plans import AnyPlan, DecodePlan, Plan, TritonPlan

__all__ = ["SMEM_RESERVE", "Shape", "default_plan", "has_table", "lookup_plan", "measured_here", "plan_for", "tile_rows"]

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


#: Output columns from which a codebook weight's plans take two warpgroups and no split.
LOOKUP_WIDE_N = 8192
#: Code-matrix depth (every pass) past which a narrow codebook weight's few rows take the
#: wgmma kernel: at 14336×4096 with two passes (28672 deep) its 8-row tiles took 47.9 µs at
#: one row against the decode kernel's 51.7 (H200).
LOOKUP_DEEP_K = 16384


def lookup_plan(shape: Shape) -> Plan | DecodePlan:
    """The plan of a codebook weight (``layout.LookupWeights``; K the depth of every pass
    laid side by side): the fastest of the plans timed on the H200 for TurboQuant layers
    (4096×14336, 14336×4096, 4096×4096, 8192×28672, 8192×14336, one pass and two; README.md,
    "TurboQuant on this backend's kernels"). Up to 8 rows the warp-level decode kernel, K split
    4 on a wide, short weight and 8 elsewhere, but the wgmma kernel's 8-row tiles on a narrow
    weight deeper than ``LOOKUP_DEEP_K``; then one warpgroup and 16-row tiles with K split;
    from 17 rows, where N is wide, two warpgroups with a producer warp and no split, else one
    warpgroup with K split."""
    m, k, n = shape.m, shape.k, shape.n
    wide = n >= LOOKUP_WIDE_N
    if m <= 8:
        if not wide and k > LOOKUP_DEEP_K:
            return Plan(1, 8, 8, 4, in_flight=True)
        return DecodePlan(split=4 if wide and k <= 4096 else 8)
    if m <= 16:
        return Plan(1, 16, 4, 4 if wide else 8, in_flight=True)
    bm = pow2_at_least(m, 32, 128)
    if wide:
        return Plan(2, bm, 4, 1, in_flight=True, ws=True)
    return Plan(1, bm, 4, 4 if bm <= 64 else 2, in_flight=True)


def _tables() -> dict[CardKey, dict[tuple[int, int, int, int], AnyPlan]]:
    from .tuned import load_tables

    return load_tables()


def _gated_tables() -> dict[CardKey, dict[tuple[int, int, int, int], AnyPlan]]:
    from .tuned import load_gated_tables

    return load_gated_tables()


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


#: A measured plan serves Ms up to this many times the M it was measured at.
M_REACH = 4

Table = dict[tuple[int, int, int, int], AnyPlan]


def tile_rows(plan: AnyPlan) -> int:
    """Activation rows one program of ``plan`` multiplies."""
    if isinstance(plan, TritonPlan):
        return 1 if plan.path == "gemv" else plan.block_m
    return plan.bm


def _serves(plan: AnyPlan, measured_m: int, m: int) -> bool:
    """Whether a plan measured at ``measured_m`` rows serves ``m`` rows: M at most
    ``M_REACH``× above, and no more passes over the weight than measured — one activation
    tile holds the call's rows, unless the measured M already took several tiles (a
    compute-bound plan, which more rows do not change in kind)."""
    rows = tile_rows(plan)
    return measured_m <= m <= M_REACH * measured_m and (m <= rows or measured_m > rows)


def _measured_row(table: Table, shape: Shape) -> tuple[bool, tuple[int, int, int, int] | None]:
    """Whether ``table`` measured this (bits, K, N), and the row whose plan serves the call:
    its largest M at or below the call's, if that plan serves it (:func:`_serves`; else None)."""
    ms = sorted(m for (b, k, n, m) in table if (b, k, n) == (shape.bits, shape.k, shape.n))
    below = [m for m in ms if m <= shape.m]
    if not below:
        return bool(ms), None
    key = (shape.bits, shape.k, shape.n, below[-1])
    return True, key if _serves(table[key], below[-1], shape.m) else None


def _measured(table: Table, shape: Shape) -> tuple[bool, AnyPlan | None]:
    """Whether ``table`` measured this (bits, K, N), and its plan for the call (:func:`_measured_row`)."""
    measured, key = _measured_row(table, shape)
    return measured, None if key is None else table[key]


def _ctas(plan: Plan, shape: Shape) -> int:
    return -(-shape.n // (64 * plan.wg)) * -(-shape.m // plan.bm) * plan.split


def _nearest_shape(table: Table, shape: Shape) -> AnyPlan | None:
    """The plan ``table`` measured for the nearest (K, N) of the same bits at an M that
    serves the call (K and N compared by ratio), its K split re-fitted so the call runs about
    as many CTAs as the measured one did; None where no row serves."""
    best: tuple[tuple[float, int], tuple[int, int, int, int]] | None = None
    for key, plan in table.items():
        bits, k, n, m = key
        if bits != shape.bits or isinstance(plan, DecodePlan) or not _serves(plan, m, shape.m):
            continue
        rank = (abs(math.log2(k / shape.k)) + abs(math.log2(n / shape.n)), shape.m - m)
        if best is None or rank < best[0]:
            best = (rank, key)
    if best is None:
        return None
    _, k, n, m = best[1]
    plan = table[best[1]]
    if not isinstance(plan, Plan):
        return plan
    measured = Shape(m, k, n, shape.bits)
    one_split = dataclasses.replace(plan, split=1)
    split = round(_ctas(plan, measured) / _ctas(one_split, shape))
    return dataclasses.replace(plan, split=max(1, min(split, shape.blocks // 2 or 1)))


def plan_for(shape: Shape, card: CardKey) -> AnyPlan:
    """The plan of the nearest table that measured this (bits, K, N) — the card's own
    first — at the largest M at or below the call's, where it serves the call; else the
    nearest measured shape's plan at the call's M, the card's own table first; else the rule.
    A :class:`DecodePlan` serves only the shape and card it was measured on."""
    tables = _tables()
    order = _nearest_first(card, list(tables))
    for key in order:
        measured, plan = _measured(tables[key], shape)
        if isinstance(plan, DecodePlan) and key != card:
            plan = None  # measured on another card: where it wins is the card's and the shape's
        if plan is not None:
            return plan
        if measured:  # this table measured the shape, not for this M: no other card's row of it
            break
    for key in order:
        plan = _nearest_shape(tables[key], shape)
        if plan is not None:
            return plan
    return default_plan(shape, card)


def gated_plan_for(shape: Shape, card: CardKey) -> AnyPlan | None:
    """The plan a gated call of ``shape`` takes where :func:`plan_for`'s cannot end gated:
    the ``"gated"`` plan of the table row that gives :func:`plan_for`'s plan (``tuned.py``),
    or None (the call then runs its plan's launch and the activation's)."""
    tables, gated = _tables(), _gated_tables()
    for key in _nearest_first(card, list(tables)):
        measured, row = _measured_row(tables[key], shape)
        if row is not None and not (isinstance(tables[key][row], DecodePlan) and key != card):
            plan = gated.get(key, {}).get(row)
            if plan is None or not _serves(plan, row[3], shape.m) or (isinstance(plan, DecodePlan) and key != card):
                return None
            return plan
        if measured:
            return None
    return None


def measured_here(shape: Shape, card: CardKey) -> bool:
    """Whether ``card``'s own table has a plan for ``shape`` (not a nearer card's, not the rule)."""
    table = _tables().get(card)
    return table is not None and _measured(table, shape)[1] is not None
