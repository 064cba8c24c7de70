"""hopper_wgmma's decode plans: a table may name the warp-level decode kernel
(``decode.py``) for a shape and M it was measured faster at; it serves no more rows than its
tile (8 or 16) and only the card and shape it was measured on; on an sm_90 GPU its bucket matches the
float64 golden for every format the layout holds, and an ordinary call takes it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from quantcore.backends.hopper_wgmma import configs
from quantcore.backends.hopper_wgmma.plans import DecodePlan, Plan, TritonPlan, plan_from_dict
from quantcore.backends.hopper_wgmma.tuned import load_tables
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.ops.linear import linear_reference
from quantcore.ops.tolerance import judge_output
from quantcore.probe.card import CardKey

from .layers import prepared_layer

H200 = CardKey("sm_90", 132, 227, 4)
H100 = CardKey("sm_90", 132, 227, 3)
SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def test_decode_plans_round_trip_and_refuse_what_they_cannot_run() -> None:
    for plan in (DecodePlan(), DecodePlan(split=8), DecodePlan(split=4, bm=16)):
        assert plan_from_dict(dataclasses.asdict(plan)) == plan
    assert plan_from_dict({"split": 8, "kind": "decode"}) == DecodePlan(8)
    assert configs.tile_rows(DecodePlan(8)) == 8 and configs.tile_rows(DecodePlan(8, bm=16)) == 16
    for bad in (dict(split=0), dict(bm=32)):
        with pytest.raises(ValueError, match="out of range"):
            DecodePlan(**bad)


@pytest.mark.parametrize("blocks", [1, 2, 3, 8, 64, 112])
@pytest.mark.parametrize("split", [1, 3, 4, 8, 64])
def test_the_grid_walks_at_least_two_steps_and_masks_a_run_past_the_end(blocks: int, split: int) -> None:
    from quantcore.backends.hopper_wgmma.decode import decode_grid, whole_runs

    steps, programs = decode_grid(blocks, split, 1)
    assert steps >= 2 and programs <= max(1, split)
    assert (programs - 1) * steps < blocks <= programs * steps  # every program has a block, all are covered
    assert whole_runs(128 * blocks, 4, blocks, steps, 1) == (blocks == programs * steps)
    assert not whole_runs(128 * blocks - 32, 4, blocks, steps, 1)  # K short of the last block


def test_a_decode_plan_serves_its_own_card_shape_and_no_more_rows_than_its_tile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    decode, sixteen = DecodePlan(8), DecodePlan(8, bm=16)
    wide = Plan(1, 32, 4, 2)
    monkeypatch.setattr(configs, "_tables", lambda: {
        H200: {(4, 8192, 28672, 1): decode, (4, 8192, 28672, 8): decode, (4, 8192, 28672, 16): sixteen,
               (4, 8192, 28672, 32): wide},
        H100: {(4, 4096, 4096, 1): Plan(1, 8, 8, 8)},
    })
    for m in (1, 2, 4, 8):
        assert configs.plan_for(configs.Shape(m, 8192, 28672, 4), H200) == decode
    assert configs.plan_for(configs.Shape(16, 8192, 28672, 4), H200) == sixteen
    for m in (5, 9, 17, 32):  # past the measured M's reach, or more rows than its tile takes
        assert not isinstance(configs.plan_for(configs.Shape(m, 8192, 28672, 4), H200), DecodePlan)
    # Another card (the H100 looks the shape up in the H200's table) and another shape
    # (the nearest measured one) never take it: where it wins is the card's and the shape's.
    for m in (1, 8):
        assert not isinstance(configs.plan_for(configs.Shape(m, 8192, 28672, 4), H100), DecodePlan)
        assert not isinstance(configs.plan_for(configs.Shape(m, 8192, 24576, 4), H200), DecodePlan)


def test_the_shipped_decode_plans_are_the_h200s_and_serve_no_more_than_their_tiles() -> None:
    tables = load_tables()
    named = {key: plan for card, table in tables.items() for key, plan in table.items()
             if isinstance(plan, DecodePlan)}
    assert named, "no shipped table names a decode plan"
    assert all(key in tables[H200] for key in named)
    for (bits, k, n, m), plan in named.items():
        assert m <= plan.bm
        assert configs.plan_for(configs.Shape(m, k, n, bits), H200) == plan
        assert not isinstance(configs.plan_for(configs.Shape(m, k, n, bits), H100), DecodePlan)
    assert not any(isinstance(p, DecodePlan) for p in tables[H100].values())
    assert any(isinstance(p, (Plan, TritonPlan)) for p in tables[H200].values())


def _prepared(fmt: GPTQ | AWQ, k: int, n: int, seed: int) -> tuple[Any, dict[str, torch.Tensor], torch.Tensor]:
    return prepared_layer(fmt, k, n, seed, "cuda")


#: (format, K, N): K = 224 and 320 are no multiple of the 128-input block; N = 72 and 80
#: leave a second 64-row tile mostly padding.
CASES = [
    pytest.param(GPTQ(bits=4, group_size=128), 1024, 192, id="gptq4-g128"),
    pytest.param(GPTQ(bits=4, group_size=32, sym=False), 224, 80, id="gptq4-g32-asym-k224"),
    pytest.param(GPTQ(bits=4, group_size=-1, sym=False), 320, 72, id="gptq4-g-1-asym-k320"),
    pytest.param(GPTQ(bits=4, group_size=64, sym=False, desc_act=True), 512, 72, id="gptq4-g64-act-order"),
    pytest.param(GPTQ(bits=8, group_size=32, sym=False), 192, 72, id="gptq8-g32-asym"),
    pytest.param(GPTQ(bits=8, group_size=128, desc_act=True), 512, 80, id="gptq8-g128-act-order"),
    pytest.param(AWQ(bits=4, group_size=64), 512, 72, id="awq4-g64"),
]


@pytest.mark.skipif(not SM90, reason="the decode kernel is compiled for sm_90 (an H100 or H200)")
@pytest.mark.parametrize(("split", "bm"), [(1, 8), (3, 8), (2, 16)])
@pytest.mark.parametrize("ci", range(len(CASES)), ids=[c.id for c in CASES])
def test_the_decode_kernel_matches_the_golden(ci: int, split: int, bm: int) -> None:
    from quantcore.backends.hopper_wgmma import launch

    fmt, k, n = CASES[ci].values
    prepared, tensors, dense = _prepared(fmt, k, n, seed=ci)
    ms = ((1, torch.bfloat16), (3, torch.float16), (8, torch.bfloat16)) if bm == 8 else (
        (1, torch.float16), (11, torch.bfloat16), (16, torch.float16))
    for m, dtype in ms:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(ci + m)).to(dtype)
        xd = x.cuda()
        if prepared.ret_idx is not None:
            xd = xd.index_select(1, prepared.ret_idx)
        for _ in range(2):  # a split-K launch must leave its counters at zero for the next
            y = launch.linear(xd.contiguous(), prepared, DecodePlan(split, bm))
        c = judge_output(y.cpu(), linear_reference(x, dense, tensors["bias"]), dtype)
        assert c.ok, f"{fmt.slug} K{k} N{n} M{m} split {split} bm {bm}: {c.problem}"


@pytest.mark.skipif(not SM90, reason="the decode kernel is compiled for sm_90 (an H100 or H200)")
def test_a_tables_decode_plan_serves_an_ordinary_call_and_a_captured_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.backends.hopper_wgmma import launch
    from quantcore.backends.hopper_wgmma.decode_bucket import DecodeBucket
    from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
    from quantcore.errors import KernelInputError

    fmt = GPTQ(bits=4, group_size=128)
    plan = DecodePlan(4)
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plan)
    prepared, tensors, dense = _prepared(fmt, 2048, 256, seed=7)
    kernel = HopperWgmmaGPTQ(fmt, "cuda")
    x = torch.randn(2, 2048, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    xd = x.cuda()
    y = kernel(xd, prepared)
    ref = linear_reference(x, dense, tensors["bias"])
    assert judge_output(y.cpu(), ref, torch.bfloat16).ok
    runs = next(v for v in launch.launch_state(prepared.qweight).values() if isinstance(v, dict) and 2 in v)
    assert isinstance(runs[2], DecodeBucket) and runs[2].plan == plan
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kernel(xd, prepared)
    xd.copy_(torch.randn(2, 2048, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16))
    graph.replay()
    assert torch.equal(captured, kernel(xd, prepared))
    with pytest.raises(KernelInputError, match="1 to 8 rows"):
        runs[2](torch.randn(9, 2048, device="cuda").to(torch.bfloat16), prepared, 9)
