"""The trtllm_moe format: golden (de)quantizer, validation, parameters."""

from __future__ import annotations

import pytest
import torch

from quantcore.api import get_format
from quantcore.errors import TensorFormatError
from quantcore.formats.trtllm_moe import TRTLLMMoE


def test_dequantize_hand_example() -> None:
    """q · scale (+ zero), q the signed code: group 64 covers K = 2 in one group."""
    q = torch.tensor([[[1, -2], [3, 4]]], dtype=torch.int8)
    s = torch.tensor([[[0.5, 0.25]]], dtype=torch.float16)
    z = torch.tensor([[[1.0, -1.0]]], dtype=torch.float16)
    sym = TRTLLMMoE(group_size=64).dequantize({"qweight": q, "scales": s})
    assert sym.tolist() == [[[0.5, -0.5], [1.5, 1.0]]]
    asym = TRTLLMMoE(group_size=64, sym=False).dequantize({"qweight": q, "scales": s, "zeros": z})
    assert asym.tolist() == [[[1.5, -1.5], [2.5, 0.0]]]


def test_groups_run_along_k_and_a_partial_last_group_counts() -> None:
    fmt = TRTLLMMoE(group_size=64)
    q = torch.ones(1, 96, 1, dtype=torch.int8)
    s = torch.tensor([[[2.0], [3.0]]], dtype=torch.float16)  # G = ceil(96 / 64) = 2
    w = fmt.dequantize({"qweight": q, "scales": s})
    assert w[0, :64, 0].eq(2.0).all() and w[0, 64:, 0].eq(3.0).all()


@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("group", [64, 128])
def test_quantize_round_trip_error_is_within_one_step(sym: bool, dtype: torch.dtype, group: int) -> None:
    gen = torch.Generator().manual_seed(group + sym)
    w = torch.randn(3, 256, 48, generator=gen) * 0.05 + torch.randn(3, 1, 48, generator=gen) * 0.02
    fmt = TRTLLMMoE(group_size=group, sym=sym, scale_dtype=dtype)
    t = fmt.quantize(w)
    assert fmt.validate(t) == {"E": 3, "K": 256, "N": 48}
    assert t["qweight"].dtype == torch.int8 and t["scales"].dtype == dtype
    assert ("zeros" in t) is not sym
    step = fmt.expand_groups(t["scales"].double(), 256)
    err = (fmt.dequantize(t) - w.double()).abs()
    # Rounding gives half a step. The stored scale and zero are rounded (unit roundoff
    # u), which moves the end of the range by up to 128·u (symmetric) or 255·u steps
    # (asymmetric) and the zero by |zero|·u; the symmetric rule (amax / 128) also clips
    # the largest magnitude by a step.
    u = 2.0**-11 if dtype == torch.float16 else 2.0**-8
    if sym:
        bound = step * (1.0 + 128 * u)
    else:
        bound = step * (0.5 + 256 * u) + fmt.expand_groups(t["zeros"].double().abs(), 256) * u
    assert (err <= bound + 1e-12).all()
    assert err.mean() < 0.3 * step.mean()


def test_symmetric_rule_is_tensorrt_llms() -> None:
    """scale = amax / 128 per group and column; the largest magnitude clips to 127."""
    w = torch.zeros(1, 64, 1)
    w[0, 0, 0], w[0, 1, 0] = 1.28, -0.64
    t = TRTLLMMoE(group_size=64).quantize(w)
    assert float(t["scales"]) == pytest.approx(0.01, rel=1e-3)
    assert t["qweight"][0, :2, 0].tolist() == [127, -64]


def test_asymmetric_codes_span_the_range() -> None:
    w = torch.linspace(-1.0, 3.0, 64).view(1, 64, 1)
    t = TRTLLMMoE(group_size=64, sym=False).quantize(w)
    assert t["qweight"].min() == -128 and t["qweight"].max() == 127


def test_constant_group_gives_zero_codes() -> None:
    t = TRTLLMMoE(group_size=64).quantize(torch.zeros(1, 64, 2))
    assert t["qweight"].eq(0).all() and t["scales"].eq(0).all()


def _valid(sym: bool = True) -> dict[str, torch.Tensor]:
    return TRTLLMMoE(sym=sym).quantize(torch.randn(2, 128, 32, generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda t: t.update(qweight=t["qweight"].int()), "qweight: expected dtype int8"),
        (lambda t: t.update(qweight=t["qweight"][0]), r"qweight: expected non-empty 3-D"),
        (lambda t: t.update(scales=t["scales"][:, :, :16]), r"scales: expected shape \(2, 1, 32\)"),
        (lambda t: t.update(scales=t["scales"].bfloat16()), "scales: expected dtype float16"),
        (lambda t: t.update(zeros=t["scales"]), "zeros: given, but the format is symmetric"),
        (lambda t: t.update(bias=t["scales"]), "unexpected tensor"),
        (lambda t: t.pop("scales"), "missing tensor"),
        (lambda t: t["scales"].__setitem__((0, 0, 0), float("nan")), "NaN or Inf"),
    ],
)
def test_validate_names_what_is_wrong(mutate, match: str) -> None:
    t = _valid()
    mutate(t)
    with pytest.raises(TensorFormatError, match=match):
        TRTLLMMoE().validate(t)


def test_asymmetric_needs_zeros() -> None:
    t = _valid(sym=False)
    t.pop("zeros")
    with pytest.raises(TensorFormatError, match="missing tensor"):
        TRTLLMMoE(sym=False).validate(t)


def test_parameters() -> None:
    fmt = get_format("trtllm_moe", group_size="64", sym="false", scale_dtype="bf16")
    assert fmt == TRTLLMMoE(group_size=64, sym=False, scale_dtype=torch.bfloat16)
    assert fmt.slug == "trtllm_moe-int8-g64-asym-bf16"
    assert fmt.op == "moe"
    with pytest.raises(TensorFormatError, match="group_size"):
        TRTLLMMoE(group_size=32)
    with pytest.raises(TensorFormatError, match="scale_dtype"):
        TRTLLMMoE(scale_dtype=torch.float32)
    with pytest.raises(TensorFormatError, match="3-D float"):
        TRTLLMMoE().quantize(torch.randn(128, 32))
