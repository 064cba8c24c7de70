"""hopper_wgmma's plans: the shipped table keyed by card, the nearest card for an untuned
one, the rule, the ring fitted to shared memory, and the declared costs that decide
``get_kernel`` between it and triton_int4."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from quantcore.backends.hopper_wgmma.configs import (
    Shape,
    default_plan,
    gated_plan_for,
    plan_for,
    tile_rows,
)
from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.plans import DecodePlan, Plan, TritonPlan, gated_plan_refusal
from quantcore.backends.hopper_wgmma.tuned import load_gated_tables, load_tables, parse_table
from quantcore.backends.triton_int4.kernel import TritonInt4GPTQ
from quantcore.cost import DeviceRates
from quantcore.formats.gptq import GPTQ
from quantcore.probe import Capabilities
from quantcore.probe.card import CardKey
from quantcore.problem import Problem

H200 = CardKey("sm_90", 132, 227, 4)
H100 = CardKey("sm_90", 132, 227, 3)
TUNED = Path(__file__).parents[2] / "backends" / "hopper_wgmma"


def test_shipped_tables_parse_into_valid_plans() -> None:
    paths = sorted(TUNED.glob("tuned-*.json"))
    assert paths, "no tuned table shipped"
    for path in paths:
        card, plans = parse_table(json.loads(path.read_text()))
        assert path.name == f"tuned-{card.slug}.json"
        assert plans and all(isinstance(p, (Plan, TritonPlan, DecodePlan)) for p in plans.values())
        assert 4 in {b for b, _, _, _ in plans}
    # A card's table may hold only what its device calls timed (the H100's: 4-bit); 8-bit
    # shapes are answered by the nearest table that has them.
    assert {b for table in load_tables().values() for b, _, _, _ in table} == {4, 8}


def test_the_table_answers_measured_shapes_and_the_m_just_below() -> None:
    table = load_tables()[H200]
    assert plan_for(Shape(16, 4096, 14336, 4), H200) == table[(4, 4096, 14336, 16)]
    assert plan_for(Shape(3, 4096, 4096, 4), H200) == table[(4, 4096, 4096, 1)]  # largest measured M below
    assert plan_for(Shape(4, 4096, 4096, 4), H200) == table[(4, 4096, 4096, 1)]  # 4x reach, its 8-row tile
    # A plan measured with several row tiles (compute-bound) serves up to 4x its M.
    assert plan_for(Shape(3000, 4096, 14336, 4), H200) == table[(4, 4096, 14336, 2048)]


def test_a_row_whose_plan_cannot_end_gated_names_one_that_can() -> None:
    """A fused gate/up layer's gated call takes a row's ``"gated"`` plan where the row's own
    is a Triton plan (tuned.py); every such plan can end gated, and no other row has one."""
    tables, gated = load_tables(), load_gated_tables()
    assert gated[H200], "the H200 table names gated plans"
    for card, rows in gated.items():
        for key, plan in rows.items():
            assert gated_plan_refusal(plan) == "", (card, key, plan)
            assert gated_plan_refusal(tables[card][key]), (card, key)  # only where the row's own cannot
    # The 8B-class fused gate/up at one row (4096 × 28672): a Triton plan, its gated call 8-row tiles.
    assert isinstance(plan_for(Shape(1, 4096, 28672, 4), H200), TritonPlan)
    assert gated_plan_for(Shape(1, 4096, 28672, 4), H200) == Plan(1, 8, 4, 2)
    assert gated_plan_for(Shape(3, 4096, 28672, 4), H200) == Plan(1, 8, 4, 2)  # the row that serves M = 3
    # A row whose own plan ends gated, and a shape no table measured, name none.
    assert gated_plan_for(Shape(16, 4096, 14336, 4), H200) is None
    assert gated_plan_for(Shape(16, 4096, 1000, 4), H200) is None


@pytest.mark.parametrize("card", [H100, H200])
@pytest.mark.parametrize(("m", "k", "n"), [(20, 4096, 14336), (64, 4096, 28672), (48, 4096, 6144),
                                           (128, 4096, 12288), (40, 8192, 57344)])
def test_a_plan_tuned_for_fewer_rows_is_not_stretched_over_more_row_tiles(card: CardKey, m: int, k: int,
                                                                          n: int) -> None:
    """A small-M plan read the weight once per row tile it was measured with: at an M its
    tile does not hold, it would read the weight again for every tile (a 16-row plan at
    M = 64: four times). Such calls take a plan whose tile holds their rows."""
    plan = plan_for(Shape(m, k, n, 4), card)
    assert tile_rows(plan) >= m


def test_the_nearest_measured_shape_lends_its_plan_with_the_split_refitted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No row of (4096, 28672) serves M = 64: the plan of the nearest shape measured at 64
    is taken, K split so the call runs about as many CTAs as the measured one."""
    measured = Plan(1, 64, 5, 4, in_flight=True)
    tables = {H100: {(4, 4096, 28672, 16): Plan(1, 16, 4, 1, in_flight=True),
                     (4, 4096, 4096, 64): measured, (4, 14336, 4096, 64): Plan(1, 32, 4, 1)}}
    monkeypatch.setattr("quantcore.backends.hopper_wgmma.configs._tables", lambda: tables)
    # 4096 x 4096: 64 tiles x 4 splits = 256 CTAs; 4096 x 28672 has 448 tiles: split 1.
    assert plan_for(Shape(64, 4096, 28672, 4), H100) == Plan(1, 64, 5, 1, in_flight=True)
    # 4096 x 1024: 16 tiles, so 16 splits keep 256 CTAs.
    assert plan_for(Shape(64, 4096, 1024, 4), H100) == Plan(1, 64, 5, 16, in_flight=True)
    # No row serves 512 rows (4x reach): the rule.
    assert plan_for(Shape(512, 4096, 28672, 4), H100) == default_plan(Shape(512, 4096, 28672, 4), H100)


def test_shapes_off_the_table_take_the_rule() -> None:
    shape = Shape(7, 4096, 11008, 4)
    assert plan_for(shape, H200) == default_plan(shape, H200)


def test_an_untuned_card_of_the_architecture_takes_the_nearest_table() -> None:
    """A card of the architecture without a table of its own (here one of a faster memory
    class) finds the nearest one: same SMs and shared memory, the closest bandwidth."""
    faster = CardKey("sm_90", 132, 227, 5)
    assert faster.nearest(load_tables()) == H200
    assert plan_for(Shape(16, 4096, 14336, 4), faster) == load_tables()[H200][(4, 4096, 14336, 16)]
    assert H100.nearest(load_tables()) == H100  # measured: its own table
    assert CardKey("sm_100", 148, 227, 8).nearest(load_tables()) is None


@pytest.mark.parametrize("m", [1, 5, 16, 64, 100, 128, 300, 2048, 8192])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("k", "n"), [(4096, 1024), (14336, 4096), (1056, 200)])
def test_the_rule_gives_valid_plans_that_fit(m: int, bits: int, k: int, n: int) -> None:
    plan = default_plan(Shape(m, k, n, bits), H100)
    assert plan.bm >= min(m, 256 if bits == 4 else 128)  # one activation tile up to the largest
    blocks = -(-k // (512 // bits))
    assert 1 <= plan.split <= max(1, blocks)
    assert plan.stage_bytes(bits, 2, 1, True) * plan.stages <= 227 * 1024
    if bits == 8:
        assert plan.bm <= 128  # 256-row tiles spill at 8 bits (README.md)


def test_plans_out_of_range_are_refused() -> None:
    for bad in [dict(wg=3, bm=16, stages=4), dict(wg=1, bm=24, stages=4), dict(wg=1, bm=16, stages=1),
                dict(wg=1, bm=16, stages=4, split=0), dict(wg=1, bm=16, stages=4, per_wait=3),
                dict(wg=1, bm=16, stages=4, per_wait=2, in_flight=True)]:
        with pytest.raises(ValueError, match="out of range"):
            Plan(**bad)


def test_a_shape_the_own_table_lacks_comes_from_the_next_nearest(monkeypatch: pytest.MonkeyPatch) -> None:
    """An H100 table that timed only 4-bit shapes answers those; 8-bit ones come from the
    H200's table, not the rule; a shape neither measured takes the rule."""
    own, other = Plan(1, 16, 4, 2, in_flight=True), Plan(1, 64, 5, 1)
    tables = {H100: {(4, 4096, 4096, 16): own}, H200: {(4, 4096, 4096, 16): other, (8, 4096, 4096, 16): other}}
    monkeypatch.setattr("quantcore.backends.hopper_wgmma.configs._tables", lambda: tables)
    assert plan_for(Shape(16, 4096, 4096, 4), H100) == own
    assert plan_for(Shape(16, 4096, 4096, 8), H100) == other
    assert plan_for(Shape(16, 4096, 4096, 4), H200) == other
    # A shape no table measured: the nearest measured shape's plan (own table first), split
    # re-fitted to the same CTA count (64 tiles x 2 there, 16 tiles here).
    assert plan_for(Shape(16, 4096, 1024, 4), H100) == Plan(1, 16, 4, 8, in_flight=True)
    # A shape the own table measured, but only at an M far below: the rule, not another table.
    assert plan_for(Shape(512, 4096, 4096, 4), H100) == default_plan(Shape(512, 4096, 4096, 4), H100)


@pytest.mark.parametrize(("blocks", "plan", "walk"), [
    (32, Plan(2, 256, 3, 1, in_flight=True), (32, 1, 1, True)),
    (32, Plan(1, 16, 8, 3, in_flight=True), (12, 3, 1, True)),  # 11 blocks each rounded up to even
    (33, Plan(1, 16, 8, 1, in_flight=True), (33, 1, 1, False)),  # an odd count: a full wait per block
    (32, Plan(1, 16, 8, 4, per_wait=2), (8, 4, 2, False)),
    (9, Plan(1, 16, 8, 2, per_wait=2), (5, 2, 1, False)),
])
def test_pairs_of_blocks_only_where_every_program_gets_an_even_count(blocks: int, plan: Plan, walk: tuple) -> None:
    from quantcore.backends.hopper_wgmma.launch import split_steps

    class _Weights:  # the one field the walk reads
        pass

    w = _Weights()
    w.blocks = blocks
    got = split_steps(w, plan)  # type: ignore[arg-type]
    assert tuple(got) == walk
    counts = [min(got.steps, blocks - p * got.steps) for p in range(got.split)]
    assert sum(counts) == blocks and min(counts) > 0
    if got.in_flight or got.per_wait == 2:
        assert all(c % 2 == 0 for c in counts)


def _cost(cls: type, m: int) -> float:
    caps = Capabilities(device="cuda:0", device_type="cuda", available=True, name="an sm_90 card",
                        compute_capability=(9, 0))
    rates = DeviceRates(3.0e12, 6.9e14, 2.0e-6, "test")
    return cls.cost(caps, Problem.linear(GPTQ(bits=4, group_size=128), M=m, K=4096, N=14336,
                                         dtype=torch.bfloat16)).seconds(rates)


@pytest.mark.parametrize("m", [16, 32, 64, 128, 512, 1024, 2048])
def test_declared_costs_rank_it_first_where_it_measured_faster(m: int) -> None:
    assert _cost(HopperWgmmaGPTQ, m) < _cost(TritonInt4GPTQ, m)


@pytest.mark.parametrize("m", [4096, 8192])
def test_declared_costs_leave_large_batches_to_dequantize_and_cublas(m: int) -> None:
    assert _cost(HopperWgmmaGPTQ, m) > _cost(TritonInt4GPTQ, m)
