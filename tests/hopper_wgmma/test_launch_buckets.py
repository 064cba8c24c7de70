"""hopper_wgmma's bound launch, checked without a GPU: a call's bucket launches exactly the
arguments, grid and constexprs that Triton's own path (``kernel_args``) would, a row count
seen before reuses its bucket, and a weight whose tensors were replaced is bound again.
The weight's descriptors are the same objects at every call of a bucket (its launch
encodes them once); x's, made per call without TensorDescriptor's checks, equals the
checked one of the plain path."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from quantcore.backends.hopper_wgmma import launch
from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.plans import Plan
from quantcore.formats.gptq import GPTQ
from tests.launch_recorder import Recorder, assert_fixed_arguments_specialise_alike, record_launches


def _same(a: Any, b: Any) -> bool:
    """Launch arguments alike: tensors by storage, descriptors (of one type) field by field."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and a.data_ptr() == b.data_ptr()
    if hasattr(a, "base") and hasattr(a, "block_shape"):
        return (type(a) is type(b) and _same(a.base, b.base) and a.padding == b.padding and list(a.shape) == list(b.shape) and list(a.strides) == list(b.strides)
                and list(a.block_shape) == list(b.block_shape) and a.layout == b.layout)
    return bool(a == b)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    return record_launches(monkeypatch, launch)


@pytest.fixture
def weights(recorded: list[Recorder]) -> Any:
    fmt = GPTQ(bits=4, group_size=128, sym=False)
    src = fmt.quantize(torch.randn(256, 512, generator=torch.Generator().manual_seed(3)) * 0.05)
    return HopperWgmmaGPTQ(fmt, "cpu").prepare(src, dtype=torch.bfloat16)


@pytest.mark.parametrize("plan", [Plan(wg=1, bm=16, stages=4, split=1), Plan(wg=2, bm=64, stages=3, split=2)],
                         ids=["one-wg", "two-wg-split"])
def test_a_bucket_launches_what_the_plain_path_would(weights: Any, recorded: list[Recorder], plan: Plan,
                                                     monkeypatch) -> None:
    monkeypatch.delenv(launch.PDL_ENV, raising=False)  # a PDL mode adds a launch option kernel_args has not
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plan)
    x = torch.randn(5, 512, dtype=torch.bfloat16)
    launch.linear(x, weights)
    (recorder,) = recorded
    (grid, args), = recorder.calls
    y, ws, counters = args[5], args[6], args[7]
    want_grid, want_args, want_const = launch.kernel_args(launch.prepare_x(x), weights, plan, y, ws, counters)
    assert grid == (*want_grid, 1)
    assert len(args) == len(want_args) and all(_same(a, b) for a, b in zip(args, want_args, strict=True))
    assert {**recorder.constexprs, **recorder.options} == want_const
    assert recorder.varying == launch.VARYING and all(isinstance(args[i], int) for i in launch.VARYING)
    assert recorder.fixed_descriptors == launch.WEIGHT_DESCRIPTORS
    assert all(hasattr(args[i], "block_shape") for i in launch.WEIGHT_DESCRIPTORS)


def test_a_row_count_seen_before_reuses_its_bucket_and_a_new_weight_is_bound_again(
    weights: Any, recorded: list[Recorder], monkeypatch,
) -> None:
    plans = {1: Plan(wg=1, bm=8, stages=4, split=2), 3: Plan(wg=1, bm=8, stages=4, split=2),
             64: Plan(wg=1, bm=64, stages=3, split=1)}
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plans[m])
    for m in (1, 1, 3, 64, 1):
        launch.linear(torch.randn(m, 512, dtype=torch.bfloat16), weights)
    assert len(recorded) == 2  # one per plan: M = 1 and 3 share theirs
    assert [len(r.calls) for r in recorded] == [4, 1]
    assert_fixed_arguments_specialise_alike(recorded)  # the weight's descriptors: one object each
    weights.scales = weights.scales.clone()
    launch.linear(torch.randn(1, 512, dtype=torch.bfloat16), weights)
    assert len(recorded) == 3


@pytest.mark.parametrize(("mode", "constexpr"), [("wait", 1), ("prefetch", 2)])
def test_a_programmatic_dependent_launch_mode_binds_its_constexpr_and_the_launch_attribute(
        weights: Any, recorded: list[Recorder], monkeypatch, mode: str, constexpr: int) -> None:
    monkeypatch.setenv(launch.PDL_ENV, mode)
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: Plan(wg=1, bm=16, stages=4, split=1))
    launch.linear(torch.randn(3, 512, dtype=torch.bfloat16), weights)
    (recorder,) = recorded
    assert recorder.constexprs["PDL"] == constexpr and recorder.options["launch_pdl"] is True


def test_off_binds_no_launch_attribute(weights: Any, recorded: list[Recorder], monkeypatch) -> None:
    monkeypatch.delenv(launch.PDL_ENV, raising=False)
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: Plan(wg=1, bm=16, stages=4, split=1))
    launch.linear(torch.randn(3, 512, dtype=torch.bfloat16), weights)
    (recorder,) = recorded
    assert recorder.constexprs["PDL"] == 0 and "launch_pdl" not in recorder.options


def test_an_unknown_mode_is_refused_naming_the_variable(weights: Any, monkeypatch) -> None:
    from quantcore.errors import InvalidArgumentError

    monkeypatch.setenv(launch.PDL_ENV, "sometimes")
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: Plan(wg=1, bm=16, stages=4, split=1))
    with pytest.raises(InvalidArgumentError, match=r"QUANTCORE_HOPPER_PDL: expected one of \['off', 'wait', 'prefetch'\], got 'sometimes'"):
        launch.linear(torch.randn(3, 512, dtype=torch.bfloat16), weights)
