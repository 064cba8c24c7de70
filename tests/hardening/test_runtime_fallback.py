"""Kernels that break at run time: bind() falls to the next candidate where that is safe,
says so in explain, and never swallows the caller's own errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from quantcore.binding import bind, call_failed
from quantcore.errors import (
    InvalidArgumentError,
    KernelInputError,
    NoKernelError,
    TensorFormatError,
    UnsupportedProblemError,
)
from quantcore.formats.gptq import GPTQ
from quantcore.problem import Problem
from quantcore.registry import Registry
from quantcore.selection import explain
from quantcore.selection.state import selection_state

from ..core.fakes import Plugin, dense_kernel

FMT = GPTQ(group_size=32, sym=False)
P = Problem.linear(FMT, M=2, K=128, N=64, dtype=torch.float32)


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return FMT.quantize(torch.randn(64, 128, generator=gen), generator=gen)


def failing(name: str, *, when: str, error: type[Exception] = RuntimeError, priority: int = 500) -> type:
    k = dense_kernel(name, priority=priority)
    if when == "prepare":
        def prepare(self: Any, tensors: Any, *, dtype: Any = None) -> Any:
            raise error(f"{name} prepare broke")
        k.prepare = prepare
    else:
        def call(self: Any, x: torch.Tensor, prepared: Any) -> torch.Tensor:
            raise error(f"{name} call broke")
        k.__call__ = call
    return k


def reference(t: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return x.double() @ FMT.dequantize(t).T


def test_prepare_failure_falls_back_and_is_explained(registry: Registry) -> None:
    registry.register(Plugin(failing("flaky_vendor", when="prepare")), name="vendor")
    t = weights()
    bound = bind(FMT, "cpu", t, problem=P, registry=registry)
    assert bound.kernel.name == "aten_cpu"
    assert bound.passed_over == [("flaky_vendor", "prepare raised RuntimeError: flaky_vendor prepare broke")]
    x = torch.randn(2, 128)
    assert (bound(x).double() - reference(t, x)).norm() / reference(t, x).norm() < 1e-5
    rows = {c.kernel: c for c in explain(FMT, "cpu", problem=P, registry=registry).candidates}
    assert rows["flaky_vendor"].status == "refused"
    assert rows["flaky_vendor"].reason == "failed at run time: prepare raised RuntimeError: flaky_vendor prepare broke"
    selection_state(registry).clear_failures()
    assert {c.kernel: c for c in explain(FMT, "cpu", problem=P, registry=registry).candidates}[
        "flaky_vendor"].status == "selected"


def test_call_failure_retries_on_next_kernel(registry: Registry) -> None:
    registry.register(Plugin(failing("crashes_on_call", when="call")), name="vendor")
    t = weights(1)
    bound = bind(FMT, "cpu", t, problem=P, registry=registry)
    assert bound.kernel.name == "crashes_on_call"
    x = torch.randn(2, 128)
    y = bound(x)
    assert bound.kernel.name == "aten_cpu"
    assert (y.double() - reference(t, x)).norm() / reference(t, x).norm() < 1e-5
    assert ("crashes_on_call", "call raised RuntimeError: crashes_on_call call broke") in bound.passed_over


def test_unsupported_weight_is_passed_over_without_blaming_the_kernel(registry: Registry) -> None:
    registry.register(Plugin(failing("picky_about_weights", when="prepare", error=UnsupportedProblemError)), name="v")
    bound = bind(FMT, "cpu", weights(2), problem=P, registry=registry)
    assert bound.kernel.name == "aten_cpu"
    assert not selection_state(registry).failures  # this weight only: the kernel stays selectable for others


@pytest.mark.parametrize("error", [TensorFormatError, KernelInputError])
def test_callers_errors_are_not_swallowed(registry: Registry, error: type[Exception]) -> None:
    registry.register(Plugin(failing("strict", when="prepare", error=error)), name="v")
    with pytest.raises(error, match="strict prepare broke"):
        bind(FMT, "cpu", weights(3), problem=P, registry=registry)
    assert not selection_state(registry).failures


def test_bad_activation_is_the_callers_error(registry: Registry) -> None:
    bound = bind(FMT, "cpu", weights(4), problem=P, registry=registry)
    with pytest.raises(KernelInputError, match=r"x: expected \[..., 128\]"):
        bound(torch.randn(2, 100))
    assert not selection_state(registry).failures and bound.kernel.name == "aten_cpu"


def test_nothing_left_is_a_clear_error(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTCORE_FORCE", "flaky_vendor")
    registry.register(Plugin(failing("flaky_vendor", when="prepare")), name="vendor")
    with pytest.raises(NoKernelError, match="no kernel could prepare this gptq4-g32-asym weight on cpu"):
        bind(FMT, "cpu", weights(5), problem=P, registry=registry)


def test_a_failure_recorded_without_exception_or_reason_is_refused(registry: Registry) -> None:
    kernel = dense_kernel("never_called")(FMT, "cpu")
    passed_over: list[tuple[str, str]] = []
    with pytest.raises(InvalidArgumentError, match=r"call_failed\(never_called\): expected the exception .* got neither"):
        call_failed(FMT, "cpu", P, kernel, None, registry=registry, passed_over=passed_over)
    assert passed_over == [] and selection_state(registry).failures == {}
