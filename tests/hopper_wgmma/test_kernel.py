"""hopper_wgmma's refusals and requirements, checked without a GPU: what ``supports``
and ``prepare`` turn away (with the reason) and the devices it declines. The kernel's
outputs are checked on an sm_90 GPU by tools/probes/hopper_wgmma_sweep.py (Gluon
has no interpreter)."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaAWQ, HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.layout import GPTQToHopper, HopperWeights
from quantcore.errors import KernelInputError, UnsupportedProblemError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.probe import Capabilities
from quantcore.problem import Problem


def _problem(fmt: GPTQ | AWQ, dtype: torch.dtype = torch.bfloat16) -> Problem:
    return Problem.linear(fmt, M=4, K=512, N=256, dtype=dtype)


@pytest.mark.parametrize(("fmt", "dtype", "why"), [
    (GPTQ(bits=3, group_size=128), torch.bfloat16, "bits=3"),
    (GPTQ(bits=4, group_size=128), torch.float32, "activation dtype fp32"),
    (GPTQ(bits=4, group_size=16), torch.bfloat16, "group_size=16"),
    (GPTQ(bits=8, group_size=96), torch.bfloat16, "group_size=96"),
    (GPTQ(bits=4, group_size=192), torch.bfloat16, "group_size=192"),
])
def test_supports_refuses_with_the_reason(fmt: GPTQ, dtype: torch.dtype, why: str) -> None:
    ok, reason = HopperWgmmaGPTQ.supports(_problem(fmt, dtype))
    assert not ok and why in reason


@pytest.mark.parametrize("fmt", [GPTQ(bits=4, group_size=32), GPTQ(bits=8, group_size=64, sym=False),
                                 GPTQ(bits=4, group_size=256), GPTQ(bits=8, group_size=-1)], ids=lambda f: f.slug)
def test_supports_takes_groups_that_divide_or_span_blocks(fmt: GPTQ) -> None:
    assert HopperWgmmaGPTQ.supports(_problem(fmt)).ok


def test_awq_goes_through_gptq_lanes() -> None:
    assert HopperWgmmaAWQ.supports(_problem(AWQ(bits=4, group_size=128))).ok
    ok, reason = HopperWgmmaAWQ.supports(_problem(GPTQ(bits=4, group_size=128)))
    assert not ok and "not AWQ" in reason


@pytest.mark.parametrize(("caps", "why"), [
    (Capabilities(device="cpu", device_type="cpu", available=True), "runs on cuda, not cpu"),
    (Capabilities(device="cuda:0", device_type="cuda", available=True, compute_capability=(8, 0)), ">= 9.0"),
    (Capabilities(device="cuda:0", device_type="cuda", available=True, compute_capability=(10, 0)), "<= 9.0"),
])
def test_requires_an_sm90_gpu(caps: Capabilities, why: str) -> None:
    reason = HopperWgmmaGPTQ.requires.check(caps)
    assert reason is not None and why in reason


def test_prepare_refuses_an_activation_dtype_it_cannot_run() -> None:
    fmt = GPTQ(bits=4, group_size=128)
    src = fmt.quantize(torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * 0.05)
    with pytest.raises(KernelInputError, match="dtype"):
        HopperWgmmaGPTQ(fmt, torch.device("cpu")).prepare(src, dtype=torch.float32)


def test_call_refuses_another_kernels_prepared_state() -> None:
    fmt = GPTQ(bits=4, group_size=128)
    with pytest.raises(KernelInputError, match="HopperWeights"):
        HopperWgmmaGPTQ(fmt, torch.device("cpu"))(torch.randn(1, 256), {"qweight": torch.zeros(1)})  # type: ignore[arg-type]


def test_prepare_is_the_layout_transform() -> None:
    fmt = GPTQ(bits=8, group_size=64, sym=False)
    src = fmt.quantize(torch.randn(64, 256, generator=torch.Generator().manual_seed(0)) * 0.05)
    got = HopperWgmmaGPTQ(fmt, torch.device("cpu")).prepare(src)
    want = GPTQToHopper(fmt).apply(src)
    assert isinstance(got, HopperWeights)
    assert torch.equal(got.qweight, want.qweight) and torch.equal(got.scales, want.scales)


def test_prepare_names_an_unsupported_g_idx() -> None:
    fmt = GPTQ(bits=4, group_size=32, desc_act=True)
    src = fmt.quantize(torch.randn(64, 96, generator=torch.Generator().manual_seed(0)))
    src["g_idx"] = torch.tensor([0] * 64 + [2] * 32, dtype=torch.int32)
    with pytest.raises(UnsupportedProblemError, match="g_idx"):
        HopperWgmmaGPTQ(fmt, torch.device("cpu")).prepare(src)
