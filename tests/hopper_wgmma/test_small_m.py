"""hopper_wgmma's small-M path: the Triton GEMV and tensor-core kernels reading the
fragment order (its own prepared state, no second copy of the weight) under Triton's
interpreter (or compiled, on a GPU), against the float64 golden output; a table's
Triton plan taken by an ordinary call; and the refusal of an operand the interpreter
gets wrong."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import torch

from quantcore.backends.hopper_wgmma import configs, launch
from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.plans import Plan, TritonPlan, plan_from_dict
from quantcore.backends.hopper_wgmma.small_m import SmallMBucket
from quantcore.errors import KernelInputError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.ops.linear import linear_reference
from quantcore.ops.tolerance import judge_output
from quantcore.probe.card import CardKey

from .layers import prepared_layer

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1 (set by the quantcore pytest plugin)", allow_module_level=True)
DEVICE = "cpu" if INTERPRETED else "cuda"
#: The interpreter's tl.dot is only right in fp32 (docs/triton-interpreter.md).
OPERAND = 0 if INTERPRETED else 1


def _prepared(fmt: GPTQ | AWQ, k: int, n: int, seed: int) -> tuple[Any, dict[str, torch.Tensor], torch.Tensor]:
    return prepared_layer(fmt, k, n, seed, DEVICE)


def _check(fmt: GPTQ | AWQ, k: int, n: int, m: int, dtype: torch.dtype, plan: TritonPlan | None,
           seed: int = 0) -> None:
    prepared, tensors, dense = _prepared(fmt, k, n, seed)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed + m)).to(dtype)
    xd = x.to(DEVICE)
    if prepared.ret_idx is not None:
        xd = xd.index_select(1, prepared.ret_idx)
    for _ in range(2):  # a split-K launch must leave its counters at zero for the next
        y = launch.linear(xd.contiguous(), prepared, plan)
    c = judge_output(y.cpu(), linear_reference(x, dense, tensors["bias"]), dtype)
    assert c.ok, f"{fmt.slug} K{k} N{n} M{m} {plan}: {c.problem}"


PLANS = [
    pytest.param(TritonPlan("mma", block_n=32, block_m=16, operand=OPERAND), id="mma"),
    pytest.param(TritonPlan("mma", block_n=16, block_m=16, split=2, block_b=2, operand=OPERAND), id="mma-split2-bb2"),
    pytest.param(TritonPlan("gemv", block_n=16, block_b=2), id="gemv-bb2"),
    pytest.param(TritonPlan("gemv", block_n=32, split=3), id="gemv-split3"),
]

#: (format, K, N): N = 72 and 80 leave a second 64-row tile mostly padding; K = 224 and
#: 320 are no multiple of the 128-input block (at 4 bits).
CASES = [
    pytest.param(GPTQ(bits=4, group_size=128), 256, 72, id="gptq4-g128"),
    pytest.param(GPTQ(bits=4, group_size=32, sym=False), 224, 80, id="gptq4-g32-asym-k224"),
    pytest.param(GPTQ(bits=4, group_size=-1, sym=False), 320, 72, id="gptq4-g-1-asym-k320"),
    pytest.param(GPTQ(bits=4, group_size=64, sym=False, desc_act=True), 256, 72, id="gptq4-g64-act-order"),
    pytest.param(GPTQ(bits=8, group_size=32, sym=False), 192, 72, id="gptq8-g32-asym"),
    pytest.param(GPTQ(bits=8, group_size=128, desc_act=True), 256, 80, id="gptq8-g128-act-order"),
    pytest.param(AWQ(bits=4, group_size=64), 256, 72, id="awq4-g64"),
]


@pytest.mark.parametrize("pi", range(len(PLANS)), ids=[p.id for p in PLANS])
@pytest.mark.parametrize("ci", range(len(CASES)), ids=[c.id for c in CASES])
def test_small_m_plans_match_the_golden(ci: int, pi: int) -> None:
    """Each (case, plan) at one M of 1..4 and one dtype, spread over the grid so that
    every M and both dtypes meet every plan and nearly every case."""
    fmt, k, n = CASES[ci].values
    m = 1 + (ci + pi) % 4
    dtype = (torch.bfloat16, torch.float16)[(ci + pi // 2) % 2]
    _check(fmt, k, n, m, dtype, PLANS[pi].values[0], seed=ci)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_every_small_m_in_both_dtypes(m: int) -> None:
    for dtype in (torch.bfloat16, torch.float16):
        _check(GPTQ(bits=4, group_size=32, sym=False), 224, 80, m, dtype,
               TritonPlan("mma", block_n=64, block_m=16, operand=OPERAND), seed=m)


def test_the_bucket_reads_the_prepared_words_in_place() -> None:
    prepared, _, _ = _prepared(GPTQ(bits=4, group_size=128, sym=False), 256, 72, seed=1)
    bucket = SmallMBucket(prepared, torch.bfloat16, torch.device(DEVICE), TritonPlan("gemv", block_n=16))
    weight, scales, zeros = bucket.fixed[:3]
    assert weight.data_ptr() == prepared.qweight.data_ptr() and weight.numel() == prepared.qweight.numel()
    assert scales is prepared.scales and zeros is prepared.zeros


def test_a_tables_triton_plan_serves_an_ordinary_call(monkeypatch: pytest.MonkeyPatch) -> None:
    fmt = GPTQ(bits=4, group_size=128)
    plan = TritonPlan("gemv", block_n=32, block_b=2)
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plan)
    prepared, tensors, dense = _prepared(fmt, 256, 72, seed=2)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    y = HopperWgmmaGPTQ(fmt, DEVICE)(x.to(DEVICE), prepared)
    c = judge_output(y.cpu(), linear_reference(x, dense, tensors["bias"]), torch.bfloat16)
    assert c.ok, c.problem
    runs = next(v for v in launch.launch_state(prepared.qweight).values() if isinstance(v, dict) and 2 in v)
    assert isinstance(runs[2], SmallMBucket) and runs[2].plan == plan


@pytest.mark.skipif(not INTERPRETED, reason="the refusal guards the interpreter's wrong bf16 dot")
def test_the_interpreter_refuses_an_integer_operand() -> None:
    prepared, _, _ = _prepared(GPTQ(bits=4, group_size=128), 256, 64, seed=3)
    x = torch.randn(1, 256).to(torch.bfloat16)
    with pytest.raises(KernelInputError, match="operand 0"):
        launch.linear(x, prepared, TritonPlan("mma", operand=1))


def test_plans_round_trip_through_their_dicts() -> None:
    for plan in (TritonPlan("mma", 64, 16, 10, 4, 4, 2, 1), TritonPlan("gemv", 32, split=3), Plan(1, 16, 8, 5)):
        assert plan_from_dict(dataclasses.asdict(plan)) == plan
    with pytest.raises(ValueError, match="out of range"):
        TritonPlan("mma", block_n=48)


def test_a_table_may_name_a_triton_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    card = CardKey("sm_90", 132, 227, 4)
    small = TritonPlan("mma", 64, 16, 10)
    monkeypatch.setattr(configs, "_tables", lambda: {card: {(4, 4096, 4096, 1): small,
                                                            (4, 4096, 4096, 16): Plan(1, 16, 8, 5)}})
    assert configs.plan_for(configs.Shape(1, 4096, 4096, 4), card) == small
    assert configs.plan_for(configs.Shape(4, 4096, 4096, 4), card) == small
    assert configs.plan_for(configs.Shape(16, 4096, 4096, 4), card) == Plan(1, 16, 8, 5)
    assert isinstance(configs.plan_for(configs.Shape(1, 4096, 4096, 4), CardKey("sm_90", 132, 227, 3)), TritonPlan)
