"""get_kernel(..., tune=True): the fastest conformant kernel wins, the answer is cached
on disk, and a fast but wrong kernel never wins."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from quantcore.formats.gptq import GPTQ
from quantcore.probe import probe
from quantcore.problem import Problem
from quantcore.registry import Registry
from quantcore.selection import explain, get_kernel
from quantcore.tuning import cache_path, shape_class

from .fakes import Plugin, costed_kernel, dense_kernel

P = Problem.linear(GPTQ(group_size=32), M=3, K=128, N=256, dtype=torch.float32)


def sleepy(name: str, seconds: float, *, priority: int, scale: float = 1.0) -> type:
    k = dense_kernel(name, priority=priority, scale=scale)
    inner = k.__call__

    def call(self: Any, x: torch.Tensor, prepared: Any) -> torch.Tensor:
        time.sleep(seconds)
        return inner(self, x, prepared)

    k.__call__ = call  # type: ignore[method-assign]
    return k


@pytest.fixture
def tuned_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Registry:
    monkeypatch.setenv("QUANTCORE_CACHE", str(tmp_path))
    reg = Registry(entry_point_group=None).load()
    import quantcore.registry.builtin_formats

    reg.register(quantcore.registry.builtin_formats, name="formats")
    reg.register(Plugin(
        sleepy("slow_high_priority", 0.02, priority=100),
        sleepy("fast_low_priority", 0.0, priority=1),
        sleepy("fastest_but_wrong", 0.0, priority=50, scale=1.05),
    ), name="fakes")
    return reg


def test_static_choice_is_priority(tuned_registry: Registry) -> None:
    assert get_kernel("gptq", "cpu", problem=P, registry=tuned_registry).name == "slow_high_priority"


def test_tuned_choice_is_fastest_conformant(tuned_registry: Registry) -> None:
    k = get_kernel("gptq", "cpu", problem=P, tune=True, registry=tuned_registry)
    assert k.name == "fast_low_priority"
    expl = explain("gptq", "cpu", problem=P, tune=True, registry=tuned_registry)
    rows = {c.kernel: c for c in expl.candidates}
    assert rows["fast_low_priority"].status == "selected"
    assert rows["slow_high_priority"].measured_s > rows["fast_low_priority"].measured_s
    assert rows["slow_high_priority"].measured_s >= 0.02
    assert rows["fastest_but_wrong"].status == "refused"
    assert "conformance check" in rows["fastest_but_wrong"].reason
    assert "measured µs" in expl.table()


def test_tuning_is_cached_on_disk(tuned_registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    get_kernel("gptq", "cpu", problem=P, tune=True, registry=tuned_registry)
    data = json.loads(cache_path().read_text())
    assert data["schema"] == "quantcore.kernel-times/1" and data["device_name"] == probe("cpu").name
    (key,) = data["entries"]
    assert key == "gptq4-g32-sym|linear|fp32|K128-M4-N256"
    entry = data["entries"][key]
    assert "torch " in entry["versions"] and "quantcore " in entry["versions"] and entry["timing"] == "perf_counter"
    assert min(entry["seconds"], key=entry["seconds"].get) == "fast_low_priority"
    assert "conformance check" in entry["refused"]["fastest_but_wrong"]

    import quantcore.tuning as tuning

    def must_not_measure(*a: Any, **k: Any) -> None:
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(tuning, "_measure", must_not_measure)
    same_class = Problem.linear(GPTQ(group_size=32), M=4, K=128, N=256, dtype=torch.float32)
    assert get_kernel("gptq", "cpu", problem=same_class, tune=True, registry=tuned_registry).name == "fast_low_priority"
    # The untuned default reads the same cache: measured beats declared.
    expl = explain("gptq", "cpu", problem=same_class, registry=tuned_registry)
    assert expl.selected.kernel == "fast_low_priority" and "measured times (cache" in expl.basis


def test_tuning_times_several_prepared_copies(tuned_registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """The weight is read from memory, as in a model: copies together beyond the cache."""
    import quantcore.tuning as tuning

    monkeypatch.setattr(tuning, "_cache_bytes", lambda device: 1 << 20)
    prepared: list[int] = []
    k = tuned_registry.kernel("gptq", "linear", "fast_low_priority").cls
    inner = k.prepare

    def counting(self: Any, tensors: Any, *, dtype: Any = None) -> Any:
        prepared.append(1)
        return inner(self, tensors, dtype=dtype)

    monkeypatch.setattr(k, "prepare", counting)
    big = Problem.linear(GPTQ(group_size=32), M=1, K=256, N=1024, dtype=torch.float32)
    tuning.tuned(big, "cpu", ["fast_low_priority"], tuned_registry, fresh=True)
    # 2 MiB of cache to cover over ~140 KiB of stored weight: the cap of 8 copies.
    assert len(prepared) == tuning.MAX_SETS


def test_explain_tune_shows_times_and_keeps_the_memory_rule(tuned_registry: Registry) -> None:
    dense_fast = costed_kernel("dense_fast", bandwidth=1.0, compute=1.0, priority=1, dense=True)
    tuned_registry.register(Plugin(dense_fast), name="dense")
    expl = explain("gptq", "cpu", problem=P, tune=True, registry=tuned_registry)
    rows = {c.kernel: c for c in expl.candidates}
    assert rows["dense_fast"].measured_s is not None and rows["dense_fast"].status == "usable"
    assert rows["dense_fast"].measured_s < rows["slow_high_priority"].measured_s
    assert expl.selected.kernel == "fast_low_priority"
    allowed = explain("gptq", "cpu", problem=P, tune=True, allow_dense=True, registry=tuned_registry)
    assert allowed.selected.kernel in {"dense_fast", "fast_low_priority"}  # both ~free: measured, not assumed
    assert "times measured on this device" in expl.basis


def test_shape_class_rounds_m_up() -> None:
    assert shape_class(P) == "K128-M4-N256"
    assert shape_class(Problem.linear(GPTQ(), M=1, K=8, N=8)) == "K8-M1-N8"
    assert shape_class(Problem.linear(GPTQ(), M=17, K=8, N=8)) == "K8-M32-N8"


def test_tune_needs_a_problem(tuned_registry: Registry) -> None:
    with pytest.raises(ValueError, match="tune=True needs a problem"):
        explain("gptq", "cpu", tune=True, registry=tuned_registry)
