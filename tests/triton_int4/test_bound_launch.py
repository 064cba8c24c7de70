"""triton_int4's bound launches (launch.py): what is decided once per run of M, and what
a call still checks.

The launch itself is replaced by a recorder where the test is about the decisions: every
argument a bucket passes at a position it does not declare ``varying`` must specialise
alike on every call (else a binary compiled for one call would run another), one bucket
serves a whole run of M, and a state whose tensors changed is bound again. With the
planning of a GPU (a stand-in H100: the shipped table's breaks, split-K) as well as the
interpreter's.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import torch

from quantcore.backends.triton_int4 import launch as launch_mod
from quantcore.backends.triton_int4 import tuned_h100
from quantcore.backends.triton_int4.configs import Shape, plan_breaks, plan_for
from quantcore.backends.triton_int4.kernel import TritonInt4GPTQ
from quantcore.errors import KernelInputError
from quantcore.formats.gptq import GPTQ
from quantcore.ops.linear import linear_reference
from quantcore.ops.tolerance import compare, tolerance_for
from tests.launch_recorder import Recorder, assert_fixed_arguments_specialise_alike, record_launches


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    return record_launches(monkeypatch, launch_mod)


@pytest.fixture
def gpu_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan as on an H100 (table, rule, split-K, dequant) while the tensors stay on the CPU."""
    monkeypatch.setattr(launch_mod, "interpreting", lambda: False)
    monkeypatch.setattr(launch_mod, "cuda_card", lambda device: tuned_h100.CARD)


def _prepared(fmt: GPTQ, k: int, n: int, device: str = "cpu") -> Any:
    gen = torch.Generator().manual_seed(k + n)
    tensors = fmt.quantize(torch.randn(n, k, generator=gen) * 0.05)
    tensors["bias"] = torch.randn(n, generator=gen).half()
    return TritonInt4GPTQ(fmt, device).prepare(tensors), tensors


@pytest.mark.parametrize("key", [*sorted({k[:4] for k in tuned_h100.PLANS}), (4, 4, 4096, 1000), (8, 1, 2048, 512)])
def test_the_plan_is_one_between_two_breaks(key: tuple[int, int, int, int]) -> None:
    bits, close, k, n = key
    shape = Shape(1, k, n, bits, close, "bf16")
    breaks = plan_breaks(shape, tuned_h100.CARD)
    start = 1
    for m in range(1, 5000):
        if m in breaks:
            start = m
        here = dataclasses.replace(shape, m=m)
        assert plan_for(here, tuned_h100.CARD) == plan_for(dataclasses.replace(shape, m=start), tuned_h100.CARD), m


@pytest.mark.parametrize("planning", ["interpreter", "gpu"])
def test_fixed_arguments_specialise_alike_on_every_call_of_a_bucket(
    recorded: list[Recorder], planning: str, request: pytest.FixtureRequest,
) -> None:
    if planning == "gpu":
        request.getfixturevalue("gpu_planning")
    w, _ = _prepared(GPTQ(bits=4, group_size=128, sym=False), 4096, 1024)
    ms = [1, 2, 5, 15, 16, 17, 24, 32, 33, 64, 100, 128, 129, 200, 300, 1100]
    base = torch.randn(1100 * 4096 + 8).to(torch.bfloat16)
    for m in ms:
        for offset in (0, 1):  # an aligned and an unaligned activation
            x2 = base[offset:offset + m * 4096].view(m, 4096)
            y = launch_mod.linear(x2, w)
            assert y.shape == (m, 1024) and y.dtype == torch.bfloat16
    runs = {(launch_mod.bisect.bisect_right(launch_mod._buckets(x2, w).breaks, m)) for m in ms}
    assert len(recorded) == len(runs)  # one bucket, one bound launch, per run of M
    assert_fixed_arguments_specialise_alike(recorded)


def test_a_bucket_is_kept_and_a_state_whose_tensors_changed_is_bound_again(recorded: list[Recorder]) -> None:
    w, _ = _prepared(GPTQ(bits=4, group_size=64), 256, 64)
    x2 = torch.randn(3, 256).to(torch.bfloat16)
    launch_mod.linear(x2, w)
    launch_mod.linear(x2, w)
    assert len(recorded) == 1 and len(recorded[0].calls) == 2
    rebuilt = dataclasses.replace(w)  # the custom op rebuilds the state object around the same tensors
    launch_mod.linear(x2, rebuilt)
    assert len(recorded) == 1 and len(recorded[0].calls) == 3
    w.scales = w.scales.clone()  # a field replaced in place
    launch_mod.linear(x2, w)
    assert len(recorded) == 2 and recorded[1].calls[0][1][2] is w.scales
    other = dataclasses.replace(w, qweight=w.qweight.clone())  # a copy: its own state
    launch_mod.linear(x2, other)
    assert len(recorded) == 3 and recorded[2].calls[0][1][1].data_ptr() == other.qweight.data_ptr()


def test_a_state_moved_to_another_device_is_bound_there(recorded: list[Recorder], gpu_planning: None) -> None:
    w, _ = _prepared(GPTQ(bits=4, group_size=64, sym=False), 256, 64)
    launch_mod.linear(torch.randn(2, 256).to(torch.bfloat16), w)
    moved = dataclasses.replace(w, **{f: getattr(w, f).to("meta") for f in ("qweight", "scales", "zeros", "bias")})
    launch_mod.linear(torch.empty(2, 256, dtype=torch.bfloat16, device="meta"), moved)
    first, second = recorded
    assert first.device == torch.device("cpu") and second.device == torch.device("meta")
    tensors = [a for a in second.calls[0][1] if isinstance(a, torch.Tensor)]
    assert tensors and all(t.device.type == "meta" for t in tensors)  # none of the CPU state's pointers


def test_linear_refuses_an_activation_whose_rows_are_not_contiguous() -> None:
    w, _ = _prepared(GPTQ(bits=4, group_size=64), 256, 64)
    x = torch.randn(3, 512).to(torch.bfloat16)[:, :256]
    with pytest.raises(KernelInputError, match=r"x2: expected a contiguous \[M, K\].*strides \(512, 1\)"):
        launch_mod.linear(x, w)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter runs the kernel on the CPU")
def test_after_binding_every_call_is_still_checked_and_strided_input_is_right() -> None:
    fmt = GPTQ(bits=4, group_size=64, sym=False, desc_act=True)
    kernel = TritonInt4GPTQ(fmt, "cpu")
    w, tensors = _prepared(fmt, 256, 64)
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    ref = linear_reference(x[:, :256], fmt.dequantize(tensors), tensors["bias"])
    for _ in range(2):
        assert compare(kernel(x[:, :256].contiguous(), w), ref, tolerance_for(torch.bfloat16)).ok
    assert compare(kernel(x[:, :256], w), ref, tolerance_for(torch.bfloat16)).ok  # strided rows: copied
    with pytest.raises(KernelInputError, match=r"x: expected \[\.\.\., 256\].*\(4, 255\)"):
        kernel(x[:, :255], w)
    with pytest.raises(KernelInputError, match=r"bf16/fp16.*float32"):
        kernel(x[:, :256].float(), w)
    with pytest.raises(KernelInputError, match=r"on cpu, got .* on meta"):
        kernel(torch.empty(4, 256, dtype=torch.bfloat16, device="meta"), w)


def test_calls_through_the_custom_op_reuse_the_bucket(recorded: list[Recorder]) -> None:
    """The op rebuilds the prepared state from its tensors at every call: the bucket, kept
    with the packed weight tensor, serves them all."""
    from quantcore.custom_ops import flatten, make_spec

    fmt = GPTQ(bits=4, group_size=64)
    kernel = TritonInt4GPTQ(fmt, "cpu")
    w, _ = _prepared(fmt, 256, 64)
    state = flatten(w)
    spec = make_spec(kernel, state, {"K": 256, "N": 64})
    x = torch.randn(2, 256).to(torch.bfloat16)
    for _ in range(3):
        y = torch.ops.quantcore.linear(x, list(state.tensors), spec)
        assert y.shape == (2, 64)
    assert len(recorded) == 1 and len(recorded[0].calls) == 3
