"""Plans measured on the first call of a shape on a card without its own table
(backends/hopper_wgmma/first_use.py), with a stand-in for the GPU timing: which plans are
timed, that the fastest is taken and cached for the next process, when nothing is timed,
and what a malformed cache or a bad setting gets."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from quantcore.backends.hopper_wgmma import first_use
from quantcore.backends.hopper_wgmma.configs import Shape, default_plan, measured_here
from quantcore.backends.hopper_wgmma.plans import Plan, TritonPlan
from quantcore.errors import InvalidArgumentError
from quantcore.probe.card import CardKey
from quantcore.probe.card_tables import H100_SXM

#: An sm_90 card no table was measured on (an H100 PCIe).
PCIE = CardKey("sm_90", 114, 227, 2)
SHAPE = Shape(1, 4096, 14336, 4)
CPU = torch.device("cpu")


class FakeTimer:
    """Times each plan by a rule; counts what it was asked."""

    def __init__(self, seconds: Callable[[Plan], float]) -> None:
        self.seconds, self.asked = seconds, []

    def __call__(self, plans: Sequence[Plan], run: Callable[[Plan], Any], device: torch.device) -> list[float]:
        self.asked.append(list(plans))
        for p in plans:
            run(p)
        return [self.seconds(p) for p in plans]


@pytest.fixture(autouse=True)
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTCORE_CACHE", str(tmp_path))
    monkeypatch.delenv(first_use.TUNE_ENV, raising=False)
    first_use._caches.clear()
    yield tmp_path
    first_use._caches.clear()


def test_the_candidates_are_the_table_plan_and_the_rule_with_k_split_both_ways() -> None:
    table = Plan(1, 8, 4, 4, in_flight=True)
    plans = first_use.candidates(SHAPE, PCIE, table)
    rule = default_plan(SHAPE, PCIE)
    assert plans[:3] == [table, Plan(1, 8, 4, 8, in_flight=True), Plan(1, 8, 4, 2, in_flight=True)]
    assert rule in plans and len(plans) == len(set(plans))
    assert all(1 <= p.split <= SHAPE.blocks for p in plans)
    # A Triton plan is not varied (its kinds are checked apart); the rule's still are.
    assert all(isinstance(p, Plan) for p in first_use.candidates(SHAPE, PCIE, TritonPlan("mma", 64, 16, 1, 4, 3, 1)))


def test_the_fastest_plan_is_taken_and_the_next_process_reads_it_without_timing(cache_home) -> None:
    table = Plan(1, 8, 4, 4, in_flight=True)
    fastest = Plan(1, 8, 4, 8, in_flight=True)
    timer = FakeTimer(lambda p: 1e-6 if p == fastest else 2e-6)
    ran: list[Plan] = []
    assert first_use.first_use_plan(SHAPE, PCIE, table, ran.append, CPU, timer=timer) == fastest
    assert len(timer.asked) == 1 and set(ran) == set(timer.asked[0])
    data = json.loads((cache_home / "hopper_wgmma" / f"{PCIE.slug}.json").read_text())
    assert data["card"] == PCIE.slug and data["entries"]["bits4-k4096-n14336-m1"]["plan"]["split"] == 8
    first_use._caches.clear()  # another process
    again = FakeTimer(lambda p: 0.0)
    m2 = Shape(2, 4096, 14336, 4)  # M = 2: the next bucket, measured anew
    assert first_use.first_use_plan(SHAPE, PCIE, table, ran.append, CPU, timer=again) == fastest
    assert again.asked == []
    first_use.first_use_plan(m2, PCIE, table, ran.append, CPU, timer=again)
    assert len(again.asked) == 1


def test_a_card_with_a_table_times_nothing_unless_always(monkeypatch) -> None:
    """Not even a shape its table lacks: that takes the nearest table's plan or the rule."""
    table = Plan(1, 8, 4, 2, in_flight=True)
    timer = FakeTimer(lambda p: float(p.split))
    for shape in (SHAPE, Shape(1, 5120, 13824, 4)):
        assert first_use.first_use_plan(shape, H100_SXM, table, lambda p: None, CPU, timer=timer) == table
    assert timer.asked == [] and measured_here(SHAPE, H100_SXM) and not measured_here(Shape(1, 5120, 13824, 4), H100_SXM)
    monkeypatch.setenv(first_use.TUNE_ENV, "always")
    chosen = first_use.first_use_plan(SHAPE, H100_SXM, table, lambda p: None, CPU, timer=timer)
    assert len(timer.asked) == 1 and chosen.split == min(p.split for p in timer.asked[0])


def test_a_small_layer_on_an_unknown_card_times_nothing() -> None:
    timer = FakeTimer(lambda p: 0.0)
    table = Plan(1, 8, 8, 4)
    small = Shape(1, 2048, 2048, 4)  # 2 MiB of codes
    assert first_use.first_use_plan(small, PCIE, table, lambda p: None, CPU, timer=timer) is table
    assert timer.asked == []


def test_off_takes_the_nearest_table_and_times_nothing(monkeypatch) -> None:
    monkeypatch.setenv(first_use.TUNE_ENV, "off")
    timer = FakeTimer(lambda p: 0.0)
    table = Plan(1, 8, 4, 4)
    assert first_use.first_use_plan(SHAPE, PCIE, table, lambda p: None, CPU, timer=timer) is table
    assert timer.asked == []


def test_an_unknown_setting_is_refused_naming_the_variable(monkeypatch) -> None:
    monkeypatch.setenv(first_use.TUNE_ENV, "sometimes")
    with pytest.raises(InvalidArgumentError, match=r"QUANTCORE_HOPPER_TUNE: expected one of \['auto', 'off', 'always'\], got 'sometimes'"):
        first_use.first_use_plan(SHAPE, PCIE, Plan(1, 8, 4, 4), lambda p: None, CPU)


@pytest.mark.parametrize("content", ["{not json", json.dumps({"schema": "other", "entries": {}}),
                                     json.dumps({"schema": first_use.SCHEMA, "card": PCIE.slug,
                                                 "entries": {"bits4-k4096-n14336-m1": {"plan": {"wg": "x"}}}})])
def test_a_malformed_cache_is_ignored_with_a_warning_and_rewritten(cache_home, caplog, content) -> None:
    path = cache_home / "hopper_wgmma" / f"{PCIE.slug}.json"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    timer = FakeTimer(lambda p: float(p.split))
    with caplog.at_level(logging.WARNING, logger="quantcore"):
        chosen = first_use.first_use_plan(SHAPE, PCIE, Plan(1, 8, 4, 4), lambda p: None, CPU, timer=timer)
    assert len(timer.asked) == 1 and chosen.split == min(p.split for p in timer.asked[0])
    assert any("ignoring" in r.getMessage() and path.name in r.getMessage() for r in caplog.records)
    data = json.loads(path.read_text())
    assert data["schema"] == first_use.SCHEMA and list(data["entries"]) == ["bits4-k4096-n14336-m1"]


def test_a_cpu_call_is_left_alone() -> None:
    from quantcore.backends.hopper_wgmma import launch

    plan = Plan(1, 16, 4, 1)
    assert launch._measured_on_first_use(1, None, torch.zeros(1, 8), plan) is plan  # type: ignore[arg-type]
