"""hopper_wgmma's gated end on an sm_90 GPU: a fused gate/up layer's call that ends with
``silu(gate) · up`` (``launch.gated_linear``) gives the same bits as the layer's call followed
by ``gated_activation``, for every plan kind that takes it (the decode kernel, split or not;
the wgmma kernel, split, in flight, with a producer warp), every format the layout holds, bf16
and fp16, a bias, rows up to the tile and past it; twice in a row (the pair counters are left
at zero); replayed from a CUDA graph; through ``QuantLinear.gated``. Plans that cannot take
it, and a call being captured, run the two launches, with the same bits."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from quantcore.backends.hopper_wgmma.plans import DecodePlan, Plan, TritonPlan
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.kernels.gated_activation import gated_activation
from quantcore.ops.tolerance import judge_output

from .layers import prepared_layer

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(not SM90, reason="hopper_wgmma's kernels are compiled for sm_90 (an H100 or H200)")

FORMATS = [
    pytest.param(GPTQ(bits=4, group_size=128), id="gptq4-g128"),
    pytest.param(GPTQ(bits=4, group_size=64, sym=False, desc_act=True), id="gptq4-g64-asym-act-order"),
    pytest.param(GPTQ(bits=8, group_size=128, sym=False), id="gptq8-g128-asym"),
    pytest.param(AWQ(bits=4, group_size=128), id="awq4-g128"),
]

#: (plan, row counts): each plan's tile, one row, a ragged count, a full tile and (wgmma) past it.
PLANS = [
    pytest.param(DecodePlan(1), (1, 5, 8), id="decode"),
    pytest.param(DecodePlan(3), (1, 8), id="decode-split3"),
    pytest.param(DecodePlan(2, bm=16), (3, 16), id="decode16-split2"),
    pytest.param(Plan(1, 16, 4, 4), (1, 16, 40), id="wgmma-bm16-split4"),
    pytest.param(Plan(2, 16, 6, 1, in_flight=True, ws=True), (7, 16, 33), id="wgmma-bm16-ws"),
    pytest.param(Plan(1, 16, 4, 2, in_flight=True), (2, 16, 17), id="wgmma-bm16-in-flight-split2"),
]

K, INTER = 1024, 256


def _layer(fmt: GPTQ | AWQ, seed: int, inter: int = INTER) -> tuple[Any, dict[str, torch.Tensor], torch.Tensor]:
    return prepared_layer(fmt, K, 2 * inter, seed, "cuda")


def _golden(x: torch.Tensor, dense: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return x.double() @ dense.T + bias.double()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("plan", "rows"), PLANS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_gated_end_gives_the_bits_of_the_two_launches(fmt: GPTQ | AWQ, plan: Any, rows: tuple[int, ...],
                                                          dtype: torch.dtype,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.backends.hopper_wgmma import launch
    from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaAWQ, HopperWgmmaGPTQ

    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plan)
    prepared, tensors, dense = _layer(fmt, seed=len(rows) + 3 * plan.bm)
    kernel = (HopperWgmmaAWQ if isinstance(fmt, AWQ) else HopperWgmmaGPTQ)(fmt, "cuda")
    for m in rows:
        x = torch.randn(m, K, generator=torch.Generator().manual_seed(m)).to(dtype)
        xd = x.cuda()
        h = kernel(xd, prepared)
        two = gated_activation(h, "silu")
        one = kernel.gated(xd, prepared, "silu")
        assert one is not None and one.shape == (m, INTER) and one.dtype == dtype
        assert torch.equal(one, two), f"{plan} M{m}: {(one.float() - two.float()).abs().max().item()} off"
        assert torch.equal(kernel.gated(xd, prepared, "silu"), two)  # its counters were left at zero
        # What the end's bits equal is the layer's output through gated_activation's contract;
        # that output against the float64 golden at the linear op's tolerance:
        verdict = judge_output(h.cpu(), _golden(x, dense, tensors["bias"]), dtype)
        assert verdict.ok, f"{plan} M{m}: {verdict.problem}"


def test_captured_gated_calls_replay_the_eager_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's gated call, captured, takes the two launches; the gated launch itself,
    captured, replays what it computes eagerly."""
    from quantcore.backends.hopper_wgmma import launch
    from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ

    fmt = GPTQ(bits=4, group_size=128)
    prepared, _, _ = _layer(fmt, seed=11)
    kernel = HopperWgmmaGPTQ(fmt, "cuda")
    for plan in (DecodePlan(1), Plan(1, 16, 4, 4)):
        monkeypatch.setattr(launch, "plan_of", lambda m, w, device, plan=plan: plan)
        xd = torch.randn(4, K, device="cuda").to(torch.bfloat16)
        kernel.gated(xd, prepared, "silu")  # compiled and bound outside the capture
        gated_activation(kernel(xd, prepared), "silu")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            two = kernel.gated(xd, prepared, "silu")
            one = launch.gated_linear(xd, prepared)
        xd.copy_(torch.randn(4, K, device="cuda").to(torch.bfloat16))
        graph.replay()
        want = gated_activation(kernel(xd, prepared), "silu")
        assert two is not None and torch.equal(two, want) and torch.equal(one, want), plan


def test_what_cannot_end_gated_runs_the_two_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.backends.hopper_wgmma import launch
    from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ

    fmt = GPTQ(bits=4, group_size=128)
    kernel = HopperWgmmaGPTQ(fmt, "cuda")
    prepared, _, _ = _layer(fmt, seed=2)
    xd = torch.randn(2, K, device="cuda").to(torch.bfloat16)
    assert kernel.gated(xd, prepared, "gelu") is None
    for plan in (Plan(2, 64, 4, 1, in_flight=True), TritonPlan()):
        monkeypatch.setattr(launch, "plan_of", lambda m, w, device, plan=plan: plan)
        prepared, _, _ = _layer(fmt, seed=3)
        got = kernel.gated(xd, prepared, "silu")
        assert got is not None and torch.equal(got, gated_activation(kernel(xd, prepared), "silu")), plan
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: DecodePlan(1))
    odd, _, _ = _layer(fmt, seed=4, inter=192)  # I not a multiple of 128: a tile would hold both halves
    got = kernel.gated(xd, odd, "silu")
    assert got is not None and torch.equal(got, gated_activation(kernel(xd, odd), "silu"))


def test_quant_linear_gated_takes_the_one_launch() -> None:
    from quantcore.nn.linear import QuantLinear

    fmt = GPTQ(bits=4, group_size=128)
    gen = torch.Generator().manual_seed(9)
    tensors = fmt.quantize(torch.randn(2 * 2048, 4096, generator=gen) * 0.05, generator=gen)
    layer = QuantLinear(fmt, {k: v.cuda() for k, v in tensors.items()}, device="cuda", prefer="hopper_wgmma")
    assert layer.kernel is not None and layer.kernel.name == "hopper_wgmma"
    x = torch.randn(3, 4096, device="cuda").to(torch.bfloat16)
    two = gated_activation(layer(x), "silu")  # the first call: the module checks its output
    assert layer.kernel.gated(x, layer.prepared, "silu") is not None
    assert torch.equal(layer.gated(x), two)
