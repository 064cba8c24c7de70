"""aten_xpu on a machine without an XPU: the transform's layout by hand, and its output
run through a plain-torch emulation of the op's contract against the golden output."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantcore.backends.aten_xpu import kernel as xpu_kernel
from quantcore.backends.aten_xpu.contract import weight_int4pack_mm_with_scales_and_zeros
from quantcore.backends.aten_xpu.kernel import AtenXpuGPTQ
from quantcore.backends.aten_xpu.transform import GPTQToInt4PackXPU
from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.errors import UnsupportedProblemError
from quantcore.formats.gptq import GPTQ
from quantcore.formats.packing import pack_codes
from quantcore.ops.linear import linear_reference
from quantcore.probe import probe
from quantcore.problem import Problem
from quantcore.selection import explain


def test_transform_layout_by_hand() -> None:
    """Codes q[i, o] = (i + 2·o) % 16, I = 16, O = 8: row o of the XPU weight holds
    inputs 0..7 in lane 0 and 8..15 in lane 1, input 8k+i in bits 4i..4i+3."""
    fmt = GPTQ(bits=4, group_size=-1, sym=False)
    q = (torch.arange(16).unsqueeze(1) + 2 * torch.arange(8).unsqueeze(0)) % 16
    zeros = torch.arange(8).unsqueeze(0)
    t = {"qweight": pack_codes(q, 4, dim=0), "qzeros": pack_codes(zeros, 4, dim=1),
         "scales": torch.full((1, 8), 0.5, dtype=torch.float16)}
    p = GPTQToInt4PackXPU(fmt).apply(t)
    assert p.weight.shape == (8, 2) and p.weight.dtype == torch.int32
    # o = 0: inputs 0..7 are codes 0..7 → 0x76543210; inputs 8..15 → 0xFEDCBA98.
    assert p.weight[0].tolist() == [0x76543210, 0xFEDCBA98 - 2**32]
    # o = 1: codes start at 2 → 0x98765432 and 0x1 0 F E D C B A → 0x10FEDCBA.
    assert p.weight[1].tolist() == [0x98765432 - 2**32, 0x10FEDCBA]
    assert p.zeros.dtype == torch.int8 and p.zeros[0].tolist() == list(range(8))
    assert p.group_size == 16 and p.ret_idx is None


FORMATS = [
    GPTQ(bits=4, group_size=32, sym=True),
    GPTQ(bits=4, group_size=32, sym=False, desc_act=True),
    GPTQ(bits=4, group_size=128, sym=False, checkpoint_format="v1"),
    GPTQ(bits=4, group_size=-1, sym=False, desc_act=True),
    GPTQ(bits=4, group_size=64, sym=False, desc_act=True, static_groups=True),
]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.slug)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_emulated_op_matches_golden(fmt: GPTQ, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's whole call path (activation permutation, bias, reshape) with the op
    replaced by its contract's emulation, against the float64 golden output."""
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(96, 256, generator=gen) * 0.05
    t = dict(fmt.quantize(w, generator=gen))
    t["bias"] = (torch.randn(96, generator=gen) * 0.1).half()
    x = torch.randn(2, 5, 256, generator=gen).to(dtype)
    golden = linear_reference(x.reshape(-1, 256), fmt.dequantize(t), t["bias"])
    monkeypatch.setattr(xpu_kernel, "fused_mm", weight_int4pack_mm_with_scales_and_zeros)
    kernel = AtenXpuGPTQ(fmt, "cpu")
    y = kernel(x, kernel.prepare(t, dtype=dtype))
    assert y.shape == (2, 5, 96) and y.dtype == dtype
    verdict = compare(y.reshape(-1, 96), golden, tolerance_for(dtype))
    assert verdict.ok, verdict.problem


def test_emulation_catches_a_wrong_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A transform that forgot the act-order permutation fails the same comparison."""
    fmt = GPTQ(bits=4, group_size=32, sym=False, desc_act=True)
    gen = torch.Generator().manual_seed(1)
    t = fmt.quantize(torch.randn(64, 128, generator=gen) * 0.05, generator=gen)
    x = torch.randn(3, 128, generator=gen).to(torch.bfloat16)
    golden = linear_reference(x, fmt.dequantize(t))
    monkeypatch.setattr(xpu_kernel, "fused_mm", weight_int4pack_mm_with_scales_and_zeros)
    kernel = AtenXpuGPTQ(fmt, "cpu")
    prepared = kernel.prepare(t)
    prepared.ret_idx = None
    assert not compare(kernel(x, prepared), golden, tolerance_for(torch.bfloat16)).ok


def test_uneven_groups_refused() -> None:
    fmt = GPTQ(bits=4, group_size=32, desc_act=True)
    t = fmt.quantize(torch.randn(16, 64) * 0.05)
    t["g_idx"] = torch.cat([torch.zeros(40), torch.ones(24)]).int()
    with pytest.raises(UnsupportedProblemError, match="groups of exactly 32"):
        GPTQToInt4PackXPU(fmt).apply(t)


def test_refused_off_xpu_with_reason() -> None:
    assert AtenXpuGPTQ.check_device(probe("cpu")) == "runs on xpu, not cpu"
    table = explain("gptq", "xpu")
    row = next(c for c in table.candidates if c.kernel == "aten_xpu")
    assert row.status == "refused" and row.reason
    fake = dataclasses.replace(probe("cpu"), device="xpu", device_type="xpu")
    assert "_weight_int4pack_mm_with_scales_and_zeros has no xpu kernel" in AtenXpuGPTQ.check_device(fake)


@pytest.mark.parametrize(
    ("fmt", "dtype", "reason"),
    [
        (GPTQ(bits=8), torch.bfloat16, "4-bit codes in int32 lanes"),
        (GPTQ(bits=4), torch.float32, "takes bf16, fp16"),
    ],
)
def test_supports_refusals(fmt: GPTQ, dtype: torch.dtype, reason: str) -> None:
    ok, why = AtenXpuGPTQ.supports(Problem.linear(fmt, M=1, K=256, N=64, dtype=dtype))
    assert not ok and reason in why
