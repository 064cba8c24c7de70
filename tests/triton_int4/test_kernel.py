"""triton_int4's kernels under Triton's interpreter (or compiled, on a GPU): every path —
GEMV, tensor-core GEMM, split-K, dequantize + matmul — on small shapes, against the
float64 golden output; and its refusals."""

from __future__ import annotations

import os

import pytest
import torch

from quantcore.backends.triton_int4.configs import (
    GemvConfig,
    MmaConfig,
    Plan,
    Shape,
    default_plan,
    plan_for,
)
from quantcore.backends.triton_int4.kernel import TritonInt4AWQ, TritonInt4GPTQ
from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.errors import KernelInputError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.ops.linear import linear_reference
from quantcore.probe import probe
from quantcore.probe.card import CardKey
from quantcore.probe.card_tables import H100_SXM
from quantcore.problem import Problem

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1 (set by the quantcore pytest plugin)", allow_module_level=True)
DEVICE = "cpu" if INTERPRETED else "cuda"
#: The interpreter's tl.dot is only right in fp32 (docs/triton-interpreter.md).
MMA_OPERAND = 0 if INTERPRETED else 1


def _case(fmt: GPTQ | AWQ, k: int, n: int, seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tensors = fmt.quantize(torch.randn(n, k, generator=gen) * 0.05)
    tensors["bias"] = torch.randn(n, generator=gen).half()
    return tensors, fmt.dequantize(tensors)


def _run(fmt: GPTQ, m: int, k: int, n: int, dtype: torch.dtype, plan: Plan | None) -> None:
    from quantcore.backends.triton_int4.launch import linear

    tensors, w = _case(fmt, k, n, seed=m)
    kernel = TritonInt4GPTQ(fmt, DEVICE)
    prepared = kernel.prepare({a: t.to(DEVICE) for a, t in tensors.items()})
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + 1)).to(dtype)
    xd = x.to(DEVICE)
    if prepared.ret_idx is not None:
        xd = xd.index_select(1, prepared.ret_idx)
    for _ in range(2):  # a split-K launch must leave its counters at zero for the next
        y = linear(xd.contiguous(), prepared, plan)
    c = compare(y, linear_reference(x, w, tensors["bias"]), tolerance_for(dtype))
    assert c.ok, f"{fmt.slug} M{m} {plan}: {c.problem}"


PLANS = [
    pytest.param(Plan("gemv", gemv=GemvConfig(16, 2, 1)), id="gemv"),
    pytest.param(Plan("gemv", gemv=GemvConfig(32, 1, 3)), id="gemv-split3"),
    pytest.param(Plan("mma", mma=MmaConfig(32, 16, 1, operand=MMA_OPERAND)), id="mma"),
    pytest.param(Plan("mma", mma=MmaConfig(16, 32, 2, operand=MMA_OPERAND, block_b=2)), id="mma-split2-bb2"),
    pytest.param(Plan("dequant"), id="dequant"),
]


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize(
    "fmt",
    [GPTQ(bits=4, group_size=64, sym=False, desc_act=True), GPTQ(bits=8, group_size=32, sym=False), GPTQ(bits=4, group_size=-1)],
    ids=lambda f: f.slug,
)
def test_paths(fmt: GPTQ, plan: Plan) -> None:
    """K = 384 (3 blocks of 128 at 4 bits, 6 of 64 at 8): the splits leave an empty tail
    that must be masked; N = 72 is no multiple of the tiles."""
    m = 1 if plan.path == "gemv" else 5
    _run(fmt, m, 384, 72, torch.bfloat16, plan)


def test_split_launches_share_the_kept_buffers_and_leave_the_counters_at_zero(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA's kept per-stream workspace and counters (forced here on the interpreter's
    device too): two layers' split-K launches, each twice, in turn on the same buffers —
    each right against the golden, every counter back at zero after each launch."""
    from quantcore.triton import split_k

    monkeypatch.setattr(split_k, "keeps_buffers", lambda device: True)
    fmt = GPTQ(bits=4, group_size=64, sym=False)
    for plan, (m, k, n) in ((Plan("gemv", gemv=GemvConfig(32, 1, 3)), (1, 384, 72)),
                            (Plan("mma", mma=MmaConfig(16, 32, 2, operand=MMA_OPERAND, block_b=2)), (5, 256, 40))):
        _run(fmt, m, k, n, torch.bfloat16, plan)
        assert split_k._WORKSPACES._kept, "the launches did not take the kept buffers"
        counters = list(split_k._COUNTERS._kept.values())
        assert counters and all(not bool(c.any()) for c in counters), f"{plan}: counters left set"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 3, 40])
def test_default_plan(m: int, dtype: torch.dtype) -> None:
    """The wrapper's own choice, K not a multiple of the block (96 at 4 bits)."""
    _run(GPTQ(bits=4, group_size=32, sym=False), m, 96, 40, dtype, None)


def test_awq_and_batch_shape() -> None:
    fmt = AWQ(group_size=64)
    tensors, w = _case(fmt, 128, 64)
    kernel = TritonInt4AWQ(fmt, DEVICE)
    prepared = kernel.prepare({a: t.to(DEVICE) for a, t in tensors.items()}, dtype=torch.float16)
    x = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(2)).half()
    y = kernel(x.to(DEVICE), prepared)
    assert y.shape == (2, 3, 64) and y.dtype == torch.float16
    ref = linear_reference(x.reshape(6, 128), w, tensors["bias"]).reshape(2, 3, 64)
    assert compare(y, ref, tolerance_for(torch.float16)).ok
    assert kernel(x[:0].to(DEVICE), prepared).shape == (0, 3, 64)


def test_bad_calls_name_what_was_wrong() -> None:
    fmt = GPTQ(bits=4, group_size=64)
    tensors, _ = _case(fmt, 128, 64)
    kernel = TritonInt4GPTQ(fmt, DEVICE)
    prepared = kernel.prepare({a: t.to(DEVICE) for a, t in tensors.items()})
    with pytest.raises(KernelInputError, match="x: expected"):
        kernel(torch.randn(1, 128, device=DEVICE), prepared)  # fp32
    with pytest.raises(KernelInputError, match="x: expected"):
        kernel(torch.randn(1, 64, device=DEVICE).half(), prepared)
    with pytest.raises(KernelInputError, match="prepared"):
        kernel(torch.randn(1, 128, device=DEVICE).half(), dict(tensors))  # type: ignore[arg-type]
    with pytest.raises(KernelInputError, match="dtype"):
        kernel.prepare(tensors, dtype=torch.float32)


@pytest.mark.parametrize(
    ("fmt", "dtype", "dims", "reason"),
    [
        (GPTQ(bits=3), torch.bfloat16, {}, "bits=3"),
        (GPTQ(bits=2), torch.bfloat16, {}, "bits=2"),
        (GPTQ(bits=4, group_size=16), torch.bfloat16, {}, "group_size=16"),
        (GPTQ(bits=4), torch.float32, {}, "activation dtype fp32"),
        (AWQ(), torch.bfloat16, {}, "not GPTQ"),
    ],
)
def test_supports_refusals(fmt: GPTQ | AWQ, dtype: torch.dtype, dims: dict[str, int], reason: str) -> None:
    ok, why = TritonInt4GPTQ.supports(Problem.linear(fmt, M=1, K=256, N=64, dtype=dtype, **dims))
    assert not ok and reason in why


def test_supports_awq_and_interpreter_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TritonInt4AWQ.supports(Problem.linear(AWQ(), M=1, K=256, N=64))
    assert not TritonInt4AWQ.supports(Problem.linear(GPTQ(), M=1, K=256, N=64))
    big = Problem.linear(GPTQ(), M=1, K=4096, N=4096)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ok, why = TritonInt4GPTQ.supports(big)
    assert not ok and "interpreter" in why
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert TritonInt4GPTQ.supports(big)


def test_ranks_below_torch_on_cpu_and_above_tinygemm_on_cuda() -> None:
    from quantcore.backends.aten_cuda.kernel import AtenCudaGPTQ
    from quantcore.backends.torch_fallback.kernel import DequantLinear

    assert TritonInt4GPTQ.priority_on(probe("cpu")) < DequantLinear.priority_on(probe("cpu"))
    assert TritonInt4GPTQ.priority > AtenCudaGPTQ.priority


def test_default_plans() -> None:
    """One row: tensor cores with 16-row tiles, K split to fill the GPU; mid M: 128-row
    tiles; large M: dequantize + cuBLAS."""
    p = default_plan(Shape(1, 14336, 4096, 4, 4, "bf16"), 132)
    assert p.path == "mma" and p.mma is not None and p.mma.block_m == 16 and p.mma.split_k > 1
    p = default_plan(Shape(512, 4096, 14336, 4, 4, "bf16"), 132)
    assert p.mma is not None and p.mma.split_k == 1 and p.mma.block_m == 128
    assert default_plan(Shape(2048, 4096, 14336, 4, 4, "bf16"), 132).path == "dequant"


def test_tuned_plans_serve_nearby_m() -> None:
    """The H100 table: M between measured ones takes the plan measured just below it;
    an H200 (no table of its own) takes the H100's; another architecture, group closes
    or shapes take the rule."""
    h100 = H100_SXM
    at = {m: plan_for(Shape(m, 4096, 14336, 4, 4, "bf16"), h100) for m in (1, 2, 16, 24, 1024, 2048, 9000)}
    assert at[2] == at[1] and at[24] == at[16] and at[1024] == plan_for(Shape(512, 4096, 14336, 4, 4, "bf16"), h100)
    assert at[2048].path == "dequant" and at[9000].path == "dequant"
    assert plan_for(Shape(16, 4096, 14336, 4, 4, "fp16"), h100) == at[16]
    other = Shape(16, 4096, 14336, 4, 1, "bf16")  # g32 closes every slice: not measured
    assert plan_for(other, h100) == default_plan(other, 132)
    h200 = CardKey("sm_90", 132, 227, 4)
    square = Shape(1, 4096, 4096, 4, 4, "bf16")  # where the table and the rule differ
    assert plan_for(square, h200) == plan_for(square, h100) != default_plan(square, 132)
    assert plan_for(Shape(16, 4096, 14336, 4, 4, "bf16"), CardKey("sm_80", 108, 163, 2)) == default_plan(
        Shape(16, 4096, 14336, 4, 4, "bf16"), 108)
