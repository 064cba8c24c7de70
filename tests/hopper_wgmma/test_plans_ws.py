"""Warp-specialised plans (``Plan.ws``: a producer warp issues the TMA loads), checked
without a GPU: they need the in-flight walk, round-trip through the tables' format (rows
written before the field existed still parse), are never the rule's
choice, launch with the consumers' warp count and the ``WS`` constexpr (not where the walk
falls back to a wait per block, nor with programmatic dependent launch), and reach the
device sweep: checked as twins of the in-flight check plans, timed from M = 128, shipped
by ``--table`` only where a check ran them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from quantcore.backends.hopper_wgmma import launch
from quantcore.backends.hopper_wgmma.configs import default_plan
from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.plans import Plan, TritonPlan, plan_from_dict
from quantcore.backends.hopper_wgmma.tuned import load_tables, parse_table
from quantcore.formats.gptq import GPTQ
from quantcore.kernels.gptq_pairs.plans import Shape
from quantcore.probe.card import CardKey
from tests.launch_recorder import Recorder, record_launches
from tools.probes.hopper_plan_times import parse_plan
from tools.probes.hopper_wgmma_sweep import (
    LATE_KIND,
    MARGIN,
    WS_KIND,
    best_table,
    candidates,
    check_cases,
    unchecked_kinds,
    unsafe_kinds,
    ws_twin,
)

WS = Plan(2, 256, 3, 1, in_flight=True, ws=True)
H200 = CardKey("sm_90", 132, 227, 4)
#: The committed sweeps a shipped `ws` plan must have been timed in.
SWEEPS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "probes"
INFO = {"device": "NVIDIA H200", "card_key": H200.__dict__}


def test_ws_needs_the_in_flight_walk() -> None:
    with pytest.raises(ValueError, match=r"ws .* needs in_flight=True"):
        Plan(2, 256, 3, 1, ws=True)
    with pytest.raises(ValueError, match=r"ws .* needs in_flight=True"):
        Plan(1, 16, 4, 1, per_wait=2, ws=True)
    assert WS.ws and not Plan(2, 256, 3, 1, in_flight=True).ws


def test_a_ws_plan_round_trips_and_rows_without_the_field_still_parse() -> None:
    assert plan_from_dict(dataclasses.asdict(WS)) == WS
    old_row = {"wg": 2, "bm": 256, "stages": 3, "split": 1, "per_wait": 1, "in_flight": True}
    parsed = plan_from_dict(old_row)
    assert parsed == Plan(2, 256, 3, 1, in_flight=True) and parsed.ws is False


def test_a_ws_stage_holds_one_more_barrier() -> None:
    plain = dataclasses.replace(WS, ws=False)
    for bits, zeros in ((4, False), (4, True), (8, False)):
        assert WS.stage_bytes(bits, 2, 1, zeros) == plain.stage_bytes(bits, 2, 1, zeros) + 8


def test_the_rule_never_names_a_ws_plan_and_tables_only_where_the_sweep_timed_one() -> None:
    for m in (1, 16, 64, 128, 512, 2048, 8192):
        for k, n in ((4096, 14336), (14336, 4096), (4096, 1024)):
            for bits in (4, 8):
                assert not default_plan(Shape(m, k, n, bits), H200).ws
    tables = load_tables()
    assert tables
    timed = {((r["bits"], r["k"], r["n"], r["m"]), plan_from_dict(r["plan"]))
             for path in SWEEPS.glob("hopper_wgmma_sweep-*.json")
             for r in json.loads(path.read_text()) if isinstance(r.get("plan"), dict) and r["plan"].get("ws")}
    # ... or named by tools/probes/hopper_plan_times.py, which checks it too.
    runs = [json.loads(path.read_text()) for path in SWEEPS.glob("hopper_plan_times-*.json")]
    timed |= {((run.get("bits", 4), r["k"], r["n"], r["m"]), parse_plan(r["variant"]))
              for run in runs for r in run["rows"] if ",ws" in r["variant"]}
    timed_keys = {key for key, _ in timed}
    for table in tables.values():
        for key, plan in table.items():
            if getattr(plan, "ws", False):
                assert plan.in_flight and key in timed_keys, (key, plan)
    assert ((4, 4096, 14336, 1), Plan(2, 8, 4, 1, in_flight=True, ws=True)) in timed


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    monkeypatch.delenv(launch.PDL_ENV, raising=False)
    return record_launches(monkeypatch, launch)


def _weights(k: int) -> Any:
    fmt = GPTQ(bits=4, group_size=128, sym=False)
    src = fmt.quantize(torch.randn(256, k, generator=torch.Generator().manual_seed(5)) * 0.05)
    return HopperWgmmaGPTQ(fmt, "cpu").prepare(src, dtype=torch.bfloat16)


@pytest.mark.parametrize("plan", [WS, Plan(1, 128, 4, 1, in_flight=True, ws=True)], ids=["two-wg", "one-wg"])
def test_a_ws_plan_launches_the_consumers_warps_and_the_ws_constexpr(recorded: list[Recorder], monkeypatch,
                                                                      plan: Plan) -> None:
    weights = _weights(512)  # 4 blocks: an even count, the in-flight walk
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plan)
    launch.linear(torch.randn(3, 512, dtype=torch.bfloat16), weights)
    (recorder,) = recorded
    # The producer warp is the compiler's to add: the launch asks for the consumers' warps.
    assert recorder.options["num_warps"] == 4 * plan.wg
    assert recorder.constexprs["WS"] is True and recorder.constexprs["IN_FLIGHT"] is True
    x = launch.prepare_x(torch.randn(3, 512, dtype=torch.bfloat16))
    y, ws, counters = torch.empty(3, 256, dtype=torch.bfloat16), torch.empty(1), torch.empty(1, dtype=torch.int32)
    _, _, const = launch.kernel_args(x, weights, plan, y, ws, counters)
    assert const["WS"] is True and const["num_warps"] == 4 * plan.wg


def test_other_plans_bind_ws_off_and_an_odd_block_count_runs_without_the_producer(recorded: list[Recorder],
                                                                                 monkeypatch) -> None:
    plans = {1: Plan(2, 256, 3, 1, in_flight=True), 2: WS}
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plans[m])
    launch.linear(torch.randn(1, 512, dtype=torch.bfloat16), _weights(512))
    launch.linear(torch.randn(2, 384, dtype=torch.bfloat16), _weights(384))  # 3 blocks: a wait per block
    assert [r.constexprs["WS"] for r in recorded] == [False, False]
    assert [r.constexprs["IN_FLIGHT"] for r in recorded] == [True, False]


@pytest.mark.parametrize("mode", ["wait", "prefetch"])
def test_with_programmatic_dependent_launch_a_ws_plan_runs_its_in_flight_twin(recorded: list[Recorder],
                                                                              monkeypatch, mode: str) -> None:
    monkeypatch.setenv(launch.PDL_ENV, mode)
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: WS)
    launch.linear(torch.randn(3, 512, dtype=torch.bfloat16), _weights(512))
    (recorder,) = recorded
    assert recorder.constexprs["WS"] is False and recorder.constexprs["IN_FLIGHT"] is True
    assert recorder.constexprs["PDL"] == launch.PDL_MODES[mode]


def test_the_sweep_checks_the_ws_twin_of_every_in_flight_check_plan() -> None:
    twins = 0
    for case in check_cases():
        plans = [p for p in case["plans"] if isinstance(p, Plan) and not p.late_scale and not p.maxnreg]
        flying = [p for p in plans if p.in_flight and not p.ws]
        assert all(ws_twin(p) in plans for p in flying), case
        assert all(dataclasses.replace(p, ws=False) in plans for p in plans if p.ws), case
        twins += len(flying)
    assert twins >= 40  # eight in-flight plans on four cases, two on most others


def test_the_sweep_times_the_ws_twin_of_every_in_flight_candidate() -> None:
    shipped = Plan(2, 256, 3, 1, in_flight=True)
    for m in (1, 16, 32, 64, 128, 512, 2048, 8192):
        plans = [p for p in candidates(m, 4096, 14336, 4, 132, shipped) if isinstance(p, Plan) and not p.late_scale]
        flying = [p for p in plans if p.in_flight and not p.ws]
        assert flying and all(ws_twin(p) in plans for p in flying), m
        assert all(dataclasses.replace(p, ws=False) in plans for p in plans if p.ws), m


def test_a_shipped_ws_plan_is_timed_with_its_waited_and_in_flight_variants() -> None:
    for m in (1, 128, 8192):
        plans = candidates(m, 4096, 14336, 4, 132, WS)
        assert plans[:4] == [
            dataclasses.replace(WS, in_flight=False, ws=False),
            dataclasses.replace(WS, per_wait=2, in_flight=False, ws=False),
            dataclasses.replace(WS, ws=False),
            WS,
        ]


def _rows(plain_us: float, ws_us: float) -> list[dict]:
    base = {"k": 4096, "n": 14336, "m": 8192, "dtype": "bf16", "bits": 4, "variant": "hopper"}
    plain = dataclasses.replace(WS, ws=False)
    return [base | {"plan": dataclasses.asdict(plain), "us": plain_us, "default": True},
            base | {"plan": dataclasses.asdict(WS), "us": ws_us, "default": False}]


def test_the_table_ships_a_ws_plan_only_where_the_check_ran_it_and_it_was_faster() -> None:
    fast = _rows(1500.0, 1500.0 * (1 - MARGIN) - 5)
    ran = [{"plan": dataclasses.asdict(WS), "ok": True, "same": True}]
    assert unchecked_kinds([]) == {WS_KIND, LATE_KIND} and not unchecked_kinds(ran) & {WS_KIND}
    taken = parse_table(best_table(fast, INFO, unsafe=unsafe_kinds(ran) | unchecked_kinds(ran)))[1]
    assert taken[(4, 4096, 14336, 8192)] == WS
    for check in ([], [{"plan": dataclasses.asdict(WS), "ok": True, "same": False}]):
        kept = parse_table(best_table(fast, INFO, unsafe=unsafe_kinds(check) | unchecked_kinds(check)))[1]
        assert kept[(4, 4096, 14336, 8192)] == dataclasses.replace(WS, ws=False)
    close = parse_table(best_table(_rows(1500.0, 1500.0 * (1 - MARGIN) + 5), INFO, unsafe=set()))[1]
    assert close[(4, 4096, 14336, 8192)] == dataclasses.replace(WS, ws=False)


def test_the_table_names_the_fastest_gated_plan_where_its_plan_cannot_end_gated() -> None:
    base = {"k": 8192, "n": 28672, "m": 16, "dtype": "bf16", "bits": 4, "variant": "hopper"}
    triton, slow, fast = TritonPlan("mma", 128, 16, split=2), Plan(1, 16, 8, 1), Plan(1, 16, 4, 2, in_flight=True)
    rows = [base | {"plan": dataclasses.asdict(triton), "us": 49.9, "default": False},
            base | {"plan": dataclasses.asdict(slow), "us": 72.4, "default": False},
            base | {"plan": dataclasses.asdict(fast), "us": 53.6, "default": True}]
    table = best_table(rows, INFO, unsafe=set())
    (row,) = table["plans"]
    assert (row["plan"], row["gated"], row["gated_us"]) == (dataclasses.asdict(triton), dataclasses.asdict(fast), 53.6)
    assert parse_table(table, "gated")[1] == {(4, 8192, 28672, 16): fast}
    # where the fastest plan ends gated itself, the row names no other
    (plain,) = best_table(rows[1:], INFO, unsafe=set())["plans"]
    assert "gated" not in plain


def test_the_sweep_times_two_warpgroups_with_a_producer_at_m_1() -> None:
    """The shipped M = 1 plan of 4096×14336 (16.4 against 18.2 µs on an H100): the sweep
    must keep timing it, or a regenerated table would drop it."""
    plans = candidates(1, 4096, 14336, 4, 132, None)
    assert Plan(2, 8, 4, 1, in_flight=True, ws=True) in plans
    assert all(p.bm == 8 for p in plans if isinstance(p, Plan) and p.wg == 2)
    # 8 bits: a ring of 6 (25.1 against 30.7 µs on an H100, whose table names it).
    assert Plan(2, 8, 6, 1, in_flight=True, ws=True) in candidates(1, 4096, 14336, 8, 132, None)
    assert Plan(2, 16, 6, 1, in_flight=True, ws=True) in candidates(16, 4096, 14336, 8, 132, None)


def test_the_sweep_times_256_row_tiles_at_8_bits_from_m_512() -> None:
    """The H200's 8-bit plans from M = 512 on the large shapes (4096×14336 M = 512: 101
    against 142 µs): two warpgroups over 256 rows with a producer warp and a ring of 4."""
    for m in (512, 2048):
        plans = candidates(m, 4096, 14336, 8, 132, None)
        assert Plan(2, 256, 4, 1, in_flight=True, ws=True) in plans, m
        assert not any(isinstance(p, Plan) and p.bm == 256 and p.stages != 4 for p in plans), m
    assert Plan(2, 256, 3, 1, in_flight=True, ws=True) in candidates(512, 4096, 14336, 4, 132, None)

