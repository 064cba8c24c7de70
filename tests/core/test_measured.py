"""Measured kernel times: shipped tables and the cache come before declared costs; a
malformed file is ignored with one warning naming it; concurrent writers never corrupt it."""

from __future__ import annotations

import json
import logging
import multiprocessing
from pathlib import Path

import pytest
import torch

import quantcore.measured as measured
from quantcore.errors import InvalidArgumentError
from quantcore.formats.gptq import GPTQ
from quantcore.probe import probe
from quantcore.problem import Problem
from quantcore.registry import Registry
from quantcore.selection import explain, get_kernel

from .fakes import Plugin, costed_kernel

FMT = GPTQ(group_size=32)
P = Problem.linear(FMT, M=3, K=256, N=512, dtype=torch.bfloat16)
CPU = probe("cpu").name


@pytest.fixture
def tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QUANTCORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measured, "SHIPPED", tmp_path / "shipped")
    (tmp_path / "shipped").mkdir()
    return tmp_path


@pytest.fixture
def two(registry: Registry) -> Registry:
    """By their declared costs ``estimated_fast`` wins every shape."""
    registry.register(Plugin(
        costed_kernel("estimated_fast", bandwidth=1.0, compute=1.0, priority=500),
        costed_kernel("estimated_slow", bandwidth=0.1, compute=0.1, priority=500),
    ), name="two")
    return registry


def usable(reg: Registry) -> list[str]:
    return [c.kernel for c in explain(FMT, "cpu", problem=P, registry=reg).candidates if c.status in ("selected", "usable")]


def write_table(path: Path, seconds: dict[str, float], *, device: str = CPU, problem: Problem = P,
                refused: dict[str, str] | None = None) -> None:
    path.write_text(json.dumps({
        "schema": measured.SCHEMA, "device_name": device,
        "entries": {measured.entry_key(problem): {"seconds": seconds, "refused": refused or {},
                                                  "timing": "perf_counter", "versions": "x"}},
    }))


def test_a_shipped_table_comes_before_declared_costs(tables: Path, two: Registry) -> None:
    assert get_kernel(FMT, "cpu", problem=P, registry=two).name == "estimated_fast"
    times = {k: 1e-3 for k in usable(two)} | {"estimated_slow": 1e-4}
    write_table(measured.shipped_file(CPU), times)
    expl = explain(FMT, "cpu", problem=P, registry=two)
    assert expl.selected.kernel == "estimated_slow" and expl.selected.reason.startswith("fastest measured")
    assert expl.selected.measured_s == pytest.approx(1e-4)
    assert f"shipped table {measured.shipped_file(CPU).name}" in expl.basis
    assert "measured µs" in expl.table()
    # get_kernel's cache of choices follows: a fresh registry state answers from the table.
    assert get_kernel(FMT, "cpu", problem=Problem.linear(FMT, M=4, K=256, N=512), registry=two).name == "estimated_slow"


def test_a_table_that_misses_a_candidate_is_not_used(tables: Path, two: Registry) -> None:
    times = {k: 1e-3 for k in usable(two) if k != "estimated_fast"} | {"estimated_slow": 1e-4}
    write_table(measured.shipped_file(CPU), times)
    expl = explain(FMT, "cpu", problem=P, registry=two)
    assert expl.selected.kernel == "estimated_fast" and "declared costs" in expl.basis


def test_the_cache_comes_before_the_shipped_table(tables: Path, two: Registry) -> None:
    names = usable(two)
    write_table(measured.shipped_file(CPU), {k: 1e-3 for k in names} | {"estimated_slow": 1e-4})
    measured.store(P, CPU, measured.Measurement({k: 1e-3 for k in names} | {"aten_cpu": 1e-5}, {},
                                                "perf_counter", measured.versions()))
    assert explain(FMT, "cpu", problem=P, registry=two).selected.kernel == "aten_cpu"
    # An entry measured with other versions is not this machine's answer any more.
    measured.store(P, CPU, measured.Measurement({k: 1e-3 for k in names} | {"aten_cpu": 1e-5}, {},
                                                "perf_counter", "torch 0.0"))
    assert explain(FMT, "cpu", problem=P, registry=two).selected.kernel == "estimated_slow"


def _malformed_cases(shipped: Path, names: list[str]) -> dict[str, tuple[str, str]]:
    good = {k: 1e-3 for k in names}
    return {
        "truncated": ('{"schema": "quantcore.kernel-times/1", "device_name": ', "JSONDecodeError"),
        "wrong keys": (json.dumps({"schema": measured.SCHEMA, "device": CPU, "rows": []}), "missing keys"),
        "bad seconds": (json.dumps({"schema": measured.SCHEMA, "device_name": CPU, "entries": {
            measured.entry_key(P): {"seconds": {"aten_cpu": "fast"}}}}), "positive numbers"),
        "another device": (json.dumps({"schema": measured.SCHEMA, "device_name": "NVIDIA H100 80GB HBM3",
                                       "entries": {measured.entry_key(P): {"seconds": good}}}), "a table for"),
        "old schema": (json.dumps({"schema": "v0", "device_name": CPU, "entries": {}}), "schema"),
        "not an object": ("[1, 2, 3]", "expected a JSON object"),
    }


@pytest.mark.parametrize("case", ["truncated", "wrong keys", "bad seconds", "another device", "old schema",
                                  "not an object"])
def test_a_malformed_table_is_ignored_with_one_warning(tables: Path, two: Registry, case: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    path = measured.shipped_file(CPU)
    text, why = _malformed_cases(path, usable(two))[case]
    path.write_text(text)
    caplog.set_level(logging.WARNING, logger="quantcore")
    for m in (3, 4, 3, 100):
        expl = explain(FMT, "cpu", problem=Problem.linear(FMT, M=m, K=256, N=512), registry=two)
        assert expl.selected.kernel == "estimated_fast" and "declared costs" in expl.basis
    get_kernel(FMT, "cpu", problem=P, registry=two)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert str(path) in warned[0] and why in warned[0]


def test_a_kernel_no_longer_registered_has_its_times_ignored(tables: Path, two: Registry,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="quantcore")
    names = usable(two)
    # The fastest in the table is a kernel that no longer exists: the others' times stand.
    write_table(measured.shipped_file(CPU), {k: 1e-3 for k in names} | {"estimated_slow": 5e-4, "renamed_away": 1e-6})
    for _ in range(3):
        assert explain(FMT, "cpu", problem=P, registry=two).selected.kernel == "estimated_slow"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "renamed_away" in warned[0] and str(measured.shipped_file(CPU)) in warned[0]


def test_an_unwritable_cache_is_logged_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("QUANTCORE_CACHE", str(blocker))
    caplog.set_level(logging.WARNING, logger="quantcore")
    measured.store(P, CPU, measured.Measurement({"aten_cpu": 1e-3}, {}, "perf_counter", measured.versions()))
    assert any("could not write the kernel-times cache" in r.getMessage() for r in caplog.records)


def test_export_refuses_another_devices_table(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    measured.export(path, "GPU A", {measured.entry_key(P): measured.Measurement({"aten_cpu": 1e-3})})
    with pytest.raises(InvalidArgumentError, match="a table for 'GPU A'"):
        measured.export(path, "GPU B", {measured.entry_key(P): measured.Measurement({"aten_cpu": 1e-3})})
    data = json.loads(path.read_text())
    assert data["device_name"] == "GPU A" and list(data["entries"]) == [measured.entry_key(P)]


def _writer(cache: str, worker: int, rounds: int) -> None:
    import os

    os.environ["QUANTCORE_CACHE"] = cache
    import quantcore.measured as m
    from quantcore.formats.gptq import GPTQ
    from quantcore.problem import Problem

    for i in range(rounds):
        p = Problem.linear(GPTQ(group_size=32), M=1 << i, K=256 + 32 * worker, N=512)
        m.store(p, "Test Device", m.Measurement({"k": 1e-3 * (worker + 1)}, {}, "perf_counter", m.versions()))


def test_concurrent_writers_never_corrupt_the_cache(tmp_path: Path) -> None:
    workers, rounds = 6, 10
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, rounds)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    path = tmp_path / "kernel-times" / "test-device.json"
    data = json.loads(path.read_text())
    assert data["device_name"] == "Test Device" and len(data["entries"]) == workers * rounds
    assert not [f for f in path.parent.iterdir() if f.name.endswith(".tmp")]
