"""aten_cpu: the transform's choices, the activation permutation, and refusals."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.aten_cpu.kernel import AtenCpuGPTQ
from quantcore.errors import KernelInputError, UnsupportedProblemError
from quantcore.formats.gptq import GPTQ
from quantcore.problem import Problem
from quantcore.transforms.gptq_rows import GPTQToRows, largest_dividing_group
from quantcore.transforms.int4pack_cpu import GPTQToInt4PackCPU


def quantized(fmt: GPTQ, n: int = 64, k: int = 256, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return fmt.quantize(torch.randn(n, k, generator=gen), generator=gen)


def reference(fmt: GPTQ, t: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return x.double() @ fmt.dequantize(t).T


@pytest.mark.parametrize("fmt", [GPTQ(group_size=-1), GPTQ(group_size=512), GPTQ(group_size=64, sym=False)])
def test_op_group_size_is_the_largest_that_fits(fmt: GPTQ) -> None:
    t = quantized(fmt, k=1024)
    p = GPTQToInt4PackCPU(fmt).apply(t)
    assert p.group_size == {-1: 256, 512: 256, 64: 64}[fmt.group_size]
    assert p.scales_offsets.shape == (1024 // p.group_size, 64, 2)


def test_symmetric_offsets_are_zero_asymmetric_are_not() -> None:
    sym = GPTQToInt4PackCPU(GPTQ(group_size=32)).apply(quantized(GPTQ(group_size=32)))
    assert torch.count_nonzero(sym.scales_offsets[..., 1]) == 0
    fmt = GPTQ(group_size=32, sym=False)
    t = quantized(fmt)
    asym = GPTQToInt4PackCPU(fmt).apply(t)
    z = fmt.unpack_zeros(t).float()
    s = t["scales"].float()
    assert torch.equal(asym.scales_offsets[..., 1], (8 - z) * s)


def test_act_order_permutes_activations_exactly_like_weights() -> None:
    fmt = GPTQ(group_size=32, desc_act=True, sym=False)
    t = quantized(fmt)
    p = GPTQToInt4PackCPU(fmt).apply(t)
    assert p.ret_idx is not None
    assert torch.equal(p.ret_idx, torch.argsort(t["g_idx"].long(), stable=True))
    x = torch.randn(5, 256)
    k = AtenCpuGPTQ(fmt, "cpu")
    y = k(x, p)
    ref = reference(fmt, t, x)
    assert (y.double() - ref).norm() / ref.norm() < 1e-5
    # Without the permutation the same weights give a wrong answer: the test can fail.
    p.ret_idx = None
    wrong = k(x, p)
    assert (wrong.double() - ref).norm() / ref.norm() > 0.1


def test_uneven_act_order_groups_use_a_dividing_size() -> None:
    g = torch.tensor([0] * 64 + [1] * 32 + [2] * 160)
    assert largest_dividing_group(g, (32, 64, 128, 256)) == 32
    assert largest_dividing_group(torch.tensor([0] * 48 + [1] * 16), (32, 64)) is None


def test_rows_transform_is_lossless() -> None:
    for fmt in (GPTQ(group_size=32, desc_act=True, sym=False, checkpoint_format="v1"), GPTQ(group_size=-1)):
        t = quantized(fmt)
        t["bias"] = torch.randn(64, dtype=torch.float16)
        tr = GPTQToRows(fmt)
        back = tr.invert(tr.apply(t))
        assert tr.invertible
        for name in t:
            assert torch.equal(back[name], t[name]), name


def test_transform_is_deterministic() -> None:
    fmt = GPTQ(group_size=32, desc_act=True, sym=False)
    t = quantized(fmt)
    a, b = GPTQToInt4PackCPU(fmt).apply(t), GPTQToInt4PackCPU(fmt).apply(t)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.scales_offsets, b.scales_offsets)


@pytest.mark.parametrize(
    ("fmt", "dims", "reason"),
    [
        (GPTQ(bits=8), {"K": 256, "N": 64}, "bits=8"),
        (GPTQ(), {"K": 256, "N": 40}, "N=40"),
        (GPTQ(group_size=48), {"K": 96, "N": 64}, "group_size=48"),
        (GPTQ(group_size=-1), {"K": 48, "N": 64}, "group_size=-1"),
    ],
)
def test_supports_refuses_with_the_rule(fmt: GPTQ, dims: dict[str, int], reason: str) -> None:
    ok, why = AtenCpuGPTQ.supports(Problem.of(fmt, dims, torch.bfloat16))
    assert not ok and why.startswith(reason)


def test_prepare_refuses_what_the_op_cannot_pack() -> None:
    fmt = GPTQ(group_size=32)
    with pytest.raises(UnsupportedProblemError, match=r"out_features: .* multiple of 16, got 8"):
        AtenCpuGPTQ(fmt, "cpu").prepare(quantized(fmt, n=8))


@pytest.mark.parametrize(
    ("x", "message"),
    [
        (torch.randn(2, 255), r"x: expected \[..., 256\] bf16/fp16/fp32 on cpu, got \(2, 255\) float32"),
        (torch.randn(2, 256).double(), r"got \(2, 256\) float64"),
        (torch.randint(0, 3, (2, 256)), r"int64"),
    ],
)
def test_call_names_the_bad_activation(x: torch.Tensor, message: str) -> None:
    fmt = GPTQ(group_size=32)
    k = AtenCpuGPTQ(fmt, "cpu")
    p = k.prepare(quantized(fmt))
    with pytest.raises(KernelInputError, match=message):
        k(x, p)
    with pytest.raises(KernelInputError, match="prepared: expected the Int4PackCPU"):
        k(torch.randn(2, 256), {"weight": 1})


def test_batched_and_noncontiguous_activations() -> None:
    fmt = GPTQ(group_size=64, sym=False)
    t = quantized(fmt)
    t["bias"] = torch.randn(64, dtype=torch.float16)
    k = AtenCpuGPTQ(fmt, "cpu")
    p = k.prepare(t, dtype=torch.float32)
    x = torch.randn(3, 4, 512)[..., ::2]  # [3, 4, 256], not contiguous
    y = k(x, p)
    assert y.shape == (3, 4, 64)
    ref = reference(fmt, t, x.reshape(-1, 256)) + t["bias"].double()
    assert (y.reshape(-1, 64).double() - ref).norm() / ref.norm() < 1e-5
    assert k(torch.randn(0, 256), p).shape == (0, 64)
