"""The hopper_wgmma sweep's candidates, checked without a GPU: Triton plans timed at
M ≤ 16 only, K split for fewer programs from M = 32; a candidate shipped by ``--table``
only where at least ``MARGIN`` faster than the plan the call took and never when the
check found one wrong; the table written parses back into Triton plans."""

from __future__ import annotations

import dataclasses

from quantcore.backends.hopper_wgmma.plans import DecodePlan, Plan, TritonPlan
from quantcore.backends.hopper_wgmma.tuned import parse_table
from tools.probes.hopper_wgmma_sweep import (
    FOCUS,
    MARGIN,
    best_table,
    candidates,
    few_program_plans,
    triton_candidates,
    unsafe_kinds,
)

INFO = {"device": "NVIDIA H200", "card_key": {"arch": "sm_90", "sms": 132, "smem_kib": 227, "bandwidth_class": 4}}
SHIPPED = Plan(1, 16, 8, 5)
SMALL = TritonPlan("mma", 64, 16, 10, 4, 4, 1)


def test_triton_plans_are_timed_at_small_m_only() -> None:
    for m in (1, 2, 4, 8, 16):
        plans = candidates(m, 4096, 4096, 4, 132, SHIPPED)
        assert plans[0] == SHIPPED
        assert [p for p in plans if isinstance(p, TritonPlan)] == triton_candidates(m, 4096, 4096, 4, 132)
        assert any(p.path == "gemv" for p in triton_candidates(m, 4096, 4096, 4, 132)) == (m <= 4)
    assert SMALL in triton_candidates(1, 4096, 4096, 4, 132)  # triton_int4's tuned plan at this shape
    # the H200 table's plan of 8192 × 28672 at M = 16 (K split in two)
    assert TritonPlan("mma", 128, 16, 2, 4, 3, 1) in triton_candidates(16, 8192, 28672, 4, 132)
    assert not any(isinstance(p, TritonPlan) for p in candidates(32, 4096, 4096, 4, 132, SHIPPED))


def test_a_shipped_triton_plan_is_timed_first() -> None:
    assert candidates(1, 4096, 4096, 4, 132, SMALL)[0] == SMALL


def _rows(shipped_us: float, triton_us: float) -> list[dict]:
    base = {"k": 4096, "n": 4096, "m": 1, "dtype": "bf16", "bits": 4, "variant": "hopper"}
    return [base | {"plan": dataclasses.asdict(SHIPPED), "us": shipped_us, "default": True},
            base | {"plan": dataclasses.asdict(SMALL), "us": triton_us, "default": False}]


def test_the_table_takes_a_triton_plan_only_past_the_margin() -> None:
    faster = best_table(_rows(8.2, 8.2 * (1 - MARGIN) - 0.05), INFO)
    plans = parse_table(faster)[1]
    assert plans[(4, 4096, 4096, 1)] == SMALL
    close = best_table(_rows(8.2, 8.2 * (1 - MARGIN) + 0.05), INFO)
    assert parse_table(close)[1][(4, 4096, 4096, 1)] == SHIPPED


def test_a_triton_plan_the_check_found_wrong_is_never_shipped() -> None:
    check = [{"plan": dataclasses.asdict(SMALL), "ok": False}, {"plan": dataclasses.asdict(SHIPPED), "ok": True}]
    unsafe = unsafe_kinds(check)
    assert unsafe == {"triton"}
    table = best_table(_rows(8.2, 6.0), INFO, unsafe=unsafe)
    assert parse_table(table)[1][(4, 4096, 4096, 1)] == SHIPPED


def test_a_shipped_decode_plan_is_timed_as_it_is_and_kept_within_the_margin() -> None:
    decode = DecodePlan(8)
    assert candidates(1, 8192, 28672, 4, 132, decode)[0] == decode
    base = {"k": 8192, "n": 28672, "m": 1, "dtype": "bf16", "bits": 4, "variant": "hopper"}
    rows = [base | {"plan": dataclasses.asdict(decode), "us": 40.7, "default": True},
            base | {"plan": dataclasses.asdict(SHIPPED), "us": 40.7 * (1 - MARGIN) + 0.05, "default": False}]
    assert parse_table(best_table(rows, INFO))[1][(4, 8192, 28672, 1)] == decode


def test_few_program_plans_fill_half_or_all_of_the_sms_from_m_32() -> None:
    assert few_program_plans(16, 4096, 1024, 4, 132) == []
    plans = few_program_plans(128, 4096, 1024, 4, 132)
    # 16 column tiles: 128-row tiles split 4 and 8, 64-row ones (two row tiles) 2 and 4
    assert [(p.bm, p.split) for p in plans] == [(128, 4), (128, 8), (64, 2), (64, 4)]
    assert all(p.in_flight and p.stages == 4 and p.wg == 1 for p in plans)
    for m, k, n in ((32, 4096, 4096), (512, 14336, 4096), (64, 4096, 1024)):
        for p in few_program_plans(m, k, n, 4, 132):
            programs = -(-n // 64) * -(-m // p.bm) * p.split
            assert programs <= 132 or p.split == 1
            assert 2 * p.split <= k // 128


def test_the_splits_focus_times_the_plan_taken_and_the_few_program_plans_only() -> None:
    taken = Plan(1, 64, 6, 8, in_flight=True)
    FOCUS[:] = ["splits"]
    try:
        plans = candidates(128, 4096, 1024, 4, 132, taken)
        assert plans[0] == taken
        assert set(plans[1:]) == set(few_program_plans(128, 4096, 1024, 4, 132))
        assert candidates(128, 4096, 1024, 4, 132, SMALL)[0] == SMALL  # a Triton plan taken stays timed
    finally:
        FOCUS[:] = []
