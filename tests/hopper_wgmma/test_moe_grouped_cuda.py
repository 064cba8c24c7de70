"""The grouped MoE launch over ``hopper_wgmma``'s kernel (``tools/probes/moe_grouped_kernel.py``)
on an sm_90 GPU: the rows of every expert bit for bit what one plain launch of the same
plan over them gives (the same tiles, the same walk), whether stored in sorted or in route
order; with each expert's short last tile split into a half-width launch, and with the
gated epilogue, against the float64 golden. The schedule and the compiled code are
checked on any machine (``test_moe_grouped.py``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantcore.backends.hopper_wgmma.moe_layout import TRTLLMMoEToHopper
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.ops.moe.reference import swiglu
from quantcore.ops.tolerance import compare, tolerance_for

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(not SM90, reason="the grouped launch is Gluon for sm_90 (an H100 or H200)")

E, TOPK, K, N, T = 4, 2, 512, 256, 45


def _case(gen_seed: int) -> tuple[TRTLLMMoE, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The format, its weights, x and skewed routing (one expert takes most routes), on the GPU."""
    fmt = TRTLLMMoE(group_size=128, sym=True, scale_dtype=torch.bfloat16)
    gen = torch.Generator(device="cuda").manual_seed(gen_seed)
    src = {"qweight": torch.randint(-128, 128, (E, K, N), dtype=torch.int8, generator=gen, device="cuda"),
           "scales": (torch.rand(E, K // 128, N, generator=gen, device="cuda") * 2e-2 + 1e-3).to(torch.bfloat16)}
    x = torch.randn(T, K, generator=gen, device="cuda").to(torch.bfloat16)
    ids = torch.randint(0, E, (T, TOPK), generator=gen, device="cuda")
    ids[: T // 2, 0] = E - 1
    return fmt, src, x, ids


def _segments(ids: torch.Tensor) -> list[tuple[int, int, int]]:
    counts = torch.bincount(ids.reshape(-1), minlength=E).tolist()
    starts = [sum(counts[:e]) for e in range(E)]
    return [(e, starts[e], starts[e] + counts[e]) for e in range(E) if counts[e]]


@pytest.mark.parametrize("route_order", [False, True])
@pytest.mark.parametrize("split_tail", [False, True])
@pytest.mark.parametrize("plan", ["1,64,4,1,in_flight", "2,128,4,1,in_flight,ws"])
def test_every_expert_gets_its_plain_launchs_rows(plan: str, split_tail: bool, route_order: bool) -> None:
    from quantcore.backends.hopper_wgmma.launch import linear
    from tools.probes.hopper_plan_times import parse_plan
    from tools.probes.moe_grouped_kernel import GroupedExperts
    from tools.probes.moe_grouped_schedule import schedule

    fmt, src, x, ids = _case(7)
    experts = TRTLLMMoEToHopper(fmt).apply(src)
    grouped = GroupedExperts.stack(experts, parse_plan(plan))
    sched = schedule(ids, E, grouped.plan.bm, grouped.n_tiles, split_tail=split_tail)
    x_sorted = x.index_select(0, sched.order // TOPK)
    y = grouped(x_sorted, sched, route_order=route_order)
    y_sorted = y[sched.order] if route_order else y
    golden_w = fmt.dequantize(src)
    for e, a, b in _segments(ids):
        mine = y_sorted[a:b]
        if not split_tail:  # a half-width tail is another tile than the plain launch's
            plain = linear(x_sorted[a:b], experts[e], dataclasses.replace(grouped.plan, split=1))
            assert torch.equal(mine, plain), e
        result = compare(mine, x_sorted[a:b].double() @ golden_w[e], tolerance_for(torch.bfloat16))
        assert result.ok, f"expert {e}: {result.problem}"


def test_the_gated_epilogue_is_the_swiglu_of_the_product() -> None:
    from tools.probes.hopper_plan_times import parse_plan
    from tools.probes.moe_grouped_kernel import GroupedExperts, gated_columns
    from tools.probes.moe_grouped_schedule import schedule

    fmt, src, x, ids = _case(11)
    order = gated_columns(N).to("cuda")
    experts = TRTLLMMoEToHopper(fmt).apply({name: t[:, :, order] for name, t in src.items()})
    grouped = GroupedExperts.stack(experts, parse_plan("2,128,4,1,in_flight,ws"))
    sched = schedule(ids, E, grouped.plan.bm, grouped.n_tiles, split_tail=True)
    x_sorted = x.index_select(0, sched.order // TOPK)
    y = grouped(x_sorted, sched, route_order=True, gated=True)[sched.order]
    assert y.shape == (T * TOPK, N // 2)
    golden_w = fmt.dequantize(src)
    for e, a, b in _segments(ids):
        golden = swiglu(x_sorted[a:b].double() @ golden_w[e])
        result = compare(y[a:b], golden, tolerance_for(torch.bfloat16))
        assert result.ok, f"expert {e}: {result.problem}"
