"""Broken kernels, judged as a user would judge them.

A kernel that writes into its activation or into the stored tensors it prepares from,
that answers in the wrong shape or dtype or with NaN, or whose ``supports`` or
``check_device`` raises, must FAIL its conformance cells (never PASS, never SKIP); a
correct one must PASS. At run time, ``bind`` and a module built with ``keep_source``
fall back past a kernel whose first answer has the wrong shape or dtype (with a
WARNING) and return the golden result.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore.binding import bind
from quantcore.conformance.runner import FAIL, PASS, Cell, run_cell
from quantcore.errors import PluginError
from quantcore.formats.gptq import GPTQ
from quantcore.nn.linear import QuantLinear
from quantcore.problem import Problem
from quantcore.registry import KernelEntry, Registry
from quantcore.selection.state import selection_state

from ..core.fakes import Plugin, dense_kernel
from .fuzz.profiles import examples
from .fuzz.seeds import seeds_for
from .fuzz.tally import attempt

BEHAVIOURS = ("correct", "writes x", "writes stored", "wrong shape", "wrong dtype", "NaN", "supports raises",
              "check_device raises")
#: What a call's first answer may get wrong and still be caught at run time.
AT_RUN_TIME = ("correct", "wrong shape", "wrong dtype")


def evil_kernel(behaviour: str, name: str = "evil", priority: int = 10_000) -> type:
    base = dense_kernel(name, priority=priority)

    def prepare(self: Any, tensors: Mapping[str, torch.Tensor], *, dtype: Any = None) -> Any:
        bias = tensors.get("bias")
        prepared = (self.fmt.dequantize(tensors, dtype=torch.float64).float(),
                    bias.float() if bias is not None else None)
        if behaviour == "writes stored":
            tensors["scales"].mul_(2)
        return prepared

    def call(self: Any, x: torch.Tensor, prepared: Any) -> torch.Tensor:
        w, bias = prepared
        y = torch.nn.functional.linear(x.float(), w, bias).to(x.dtype)
        if behaviour == "writes x":
            x.mul_(-1)
        elif behaviour == "wrong shape":
            y = y[..., :-1]
        elif behaviour == "wrong dtype":
            y = y.double()
        elif behaviour == "NaN":
            y = torch.full_like(y, float("nan"))
        return y

    def raising(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError(f"{behaviour}: vendor check broke")

    base.prepare, base.__call__ = prepare, call
    if behaviour == "supports raises":
        base.supports = classmethod(raising)
    if behaviour == "check_device raises":
        base.check_device = classmethod(raising)
    return base


GPTQ_CASES = list(seeds_for("gptq", "linear"))


@settings(max_examples=examples("kernel"))
@given(behaviour=st.sampled_from(BEHAVIOURS), case=st.sampled_from(GPTQ_CASES))
def test_the_matrix_fails_what_a_user_would_notice(behaviour: str, case: Any) -> None:
    entry = KernelEntry(evil_kernel(behaviour), "evil_plugin")

    def judge(result: Any) -> str | None:
        want = PASS if behaviour == "correct" else FAIL
        if result.status != want:
            return f"a kernel that {behaviour} is {result.status} ({result.reason}), expected {want}"
        if behaviour.endswith("raises") and "ZeroDivisionError" not in result.reason:
            return f"the FAIL does not say what raised: {result.reason}"
        return None

    attempt(f"matrix:{behaviour}", lambda: run_cell(Cell(case, entry), "cpu"), names=(), judge=judge,
            allow_refusal=False, context=f"{case.id}, a kernel that {behaviour}")


FMT = GPTQ(group_size=32, sym=False)
P = Problem.linear(FMT, M=2, K=128, N=64, dtype=torch.float32)


def _weights(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return FMT.quantize(torch.randn(64, 128, generator=gen), generator=gen)


@settings(max_examples=examples("kernel"))
@given(behaviour=st.sampled_from(AT_RUN_TIME), seed=st.integers(0, 2**16), module=st.booleans(),
       rows=st.integers(1, 4))
def test_a_wrong_first_answer_falls_back(behaviour: str, seed: int, module: bool, rows: int,
                                         caplog: pytest.LogCaptureFixture) -> None:
    from quantcore import registry as registry_module

    reg = Registry(entry_point_group="quantcore").load()
    plugin = reg.register(Plugin(evil_kernel(behaviour, name=f"evil_{behaviour.replace(' ', '_')}")),
                          name=f"evil_{seed}_{module}_{rows}_{behaviour}")
    tensors = _weights(seed)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(seed))
    ref = x.double() @ FMT.dequantize(tensors).T

    def run() -> torch.Tensor:
        if module:
            old = registry_module._default
            registry_module._default = reg
            try:
                layer = QuantLinear(FMT, tensors, dtype=torch.float32, keep_source=True)
                return layer(x)
            finally:
                registry_module._default = old
        return bind(FMT, "cpu", tensors, problem=P, registry=reg)(x)  # type: ignore[no-any-return]

    def judge(y: Any) -> str | None:
        if not isinstance(y, torch.Tensor) or y.shape != ref.shape or y.dtype != torch.float32:
            return f"returned {y!r:.80}"
        rel = ((y.double() - ref).norm() / ref.norm()).item()
        if rel > 1e-5:
            return f"rel error {rel:.2e}"
        failed = selection_state(reg).failures
        if behaviour != "correct" and not any("first call returned a wrong result" in why for why in failed.values()):
            return f"the wrong answer was not recorded as the kernel's failure: {failed}"
        return None

    caplog.set_level(logging.WARNING, logger="quantcore")
    try:
        attempt(f"runtime:{behaviour}", run, names=(), judge=judge, allow_refusal=False,
                unnamed=(PluginError,), context=f"module={module}, seed={seed}")
    finally:
        reg.unregister(plugin)
        selection_state(reg).clear_failures()
    if behaviour != "correct":
        assert any("first call returned a wrong result" in r.getMessage() for r in caplog.records)
    caplog.clear()
