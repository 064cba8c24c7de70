"""GPTQ at every bit width: golden quantize/dequantize, v1 ↔ v2, static groups, validation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantcore.errors import TensorFormatError
from quantcore.formats.gptq import GPTQ, convert_checkpoint_format
from quantcore.formats.packing import pack_codes

BITS = (2, 3, 4, 8)


def _weight(o: int = 64, i: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randn(o, i, generator=torch.Generator().manual_seed(seed)) * 0.05


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("desc_act", [False, True])
def test_quantize_dequantize_error_within_half_step(bits: int, sym: bool, desc_act: bool) -> None:
    """Round-to-nearest: every weight comes back within half a step where the grid covers
    it; the clamp at the grid's top costs at most another half step (asymmetric: the
    rounded zero shifts the grid), plus the fp16 rounding of the stored scale."""
    fmt = GPTQ(bits=bits, group_size=64, sym=sym, desc_act=desc_act)
    w = _weight()
    t = fmt.quantize(w, generator=torch.Generator().manual_seed(1))
    fmt.validate(t)
    assert t["qweight"].shape == (256 * bits // 32, 64)
    assert t["qzeros"].shape == (4, 64 * bits // 32)
    dq = fmt.dequantize(t).float()
    step = t["scales"].float()[t["g_idx"].long()].T  # [O, I]
    fp16_slack = 2 ** (bits - 1) * 2**-11  # the stored scale's rounding, at the grid's end
    bound = 0.5 + fp16_slack + (0.0 if sym else 0.5)
    assert ((dq - w).abs() <= bound * step).all()
    assert ((dq - w).abs() <= 0.5 * step).float().mean() > 0.95
    assert (t["g_idx"].diff() < 0).any() == desc_act


def test_error_falls_with_bits() -> None:
    w = _weight()
    errs = [(GPTQ(bits=b).dequantize(GPTQ(bits=b, group_size=128).quantize(w)).float() - w).norm() for b in BITS]
    assert errs == sorted(errs, reverse=True)


def test_tiny_golden_dequantize_3bit_v1() -> None:
    """I = O = 32, one group, 3-bit, v1: codes and zeros written by hand."""
    fmt = GPTQ(bits=3, group_size=-1, sym=False, checkpoint_format="v1")
    codes = (torch.arange(32).unsqueeze(1) + torch.arange(32).unsqueeze(0)) % 8  # q[i, o]
    zeros = torch.arange(32) % 8  # z[o]; o = 0 has z = 0, stored in v1 as 7
    scales = torch.full((1, 32), 0.25, dtype=torch.float16)
    stored = (zeros - 1) % 8
    t = {
        "qweight": pack_codes(codes, 3, dim=0),
        "qzeros": pack_codes(stored.unsqueeze(0), 3, dim=1),
        "scales": scales,
    }
    expected = ((codes - zeros.unsqueeze(0)) * 0.25).T.double()
    assert torch.equal(fmt.dequantize(t), expected)
    assert fmt.dequantize(t)[0, 1].item() == 0.25  # q = 1, z = 0: the zero of 0 survives


@pytest.mark.parametrize("bits", BITS)
def test_v1_v2_round_trip_every_zero(bits: int) -> None:
    """v2 → v1 → v2 is lossless for every zero value, 0 and 2^b − 1 included."""
    o = 32 * (2 ** bits // 32 + 1)
    fmt = GPTQ(bits=bits, group_size=-1, sym=False, checkpoint_format="v2")
    t = fmt.quantize(_weight(o=o, i=64))
    zeros = torch.arange(o).remainder(2**bits).unsqueeze(0)  # every zero value appears
    t["qzeros"] = pack_codes(zeros, bits, dim=1)
    v1, t1 = convert_checkpoint_format(fmt, t, "gptq")
    assert v1.checkpoint_format == "v1" and v1.slug.endswith("-v1")
    assert torch.equal(v1.unpack_zeros(t1), zeros.int())
    assert not torch.equal(t1["qzeros"], t["qzeros"])
    assert torch.equal(v1.dequantize(t1), fmt.dequantize(t))
    v2, t2 = convert_checkpoint_format(v1, t1, "v2")
    assert v2 == fmt
    assert all(torch.equal(t2[k], t[k]) for k in t)


def test_v1_zero_of_zero_is_all_ones_field() -> None:
    """z = 0 is stored in v1 as the field 2^b − 1, touching no other field."""
    fmt = GPTQ(bits=4, group_size=-1, sym=False)
    t = fmt.quantize(_weight(o=8, i=32))
    t["qzeros"] = pack_codes(torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7]]), 4, dim=1)
    _, t1 = convert_checkpoint_format(fmt, t, "v1")
    assert t1["qzeros"].item() == 0x6543210F  # fields z − 1 = 15, 0, 1, ..., 6


def test_static_groups_keep_g_idx_monotonic() -> None:
    fmt = GPTQ(bits=4, group_size=32, desc_act=True, static_groups=True)
    t = fmt.quantize(_weight(), generator=torch.Generator().manual_seed(0))
    assert torch.equal(t["g_idx"], (torch.arange(256) // 32).int())
    assert fmt.slug == "gptq4-g32-sym-act-static"


def test_g_idx_disagreeing_with_config_is_an_error() -> None:
    act = GPTQ(bits=4, group_size=32, desc_act=True)
    t = act.quantize(_weight(), generator=torch.Generator().manual_seed(0))
    for fmt in (GPTQ(bits=4, group_size=32), dataclasses.replace(act, static_groups=True)):
        with pytest.raises(TensorFormatError, match=r"g_idx: .* expects g_idx\[i\] = i // 32"):
            fmt.validate(t)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int64])
def test_pack_dtypes(dtype: torch.dtype) -> None:
    fmt = GPTQ(bits=4, group_size=64, sym=False, pack_dtype=dtype)
    ref = GPTQ(bits=4, group_size=64, sym=False)
    w = _weight()
    t = fmt.quantize(w)
    assert t["qweight"].dtype == dtype and t["qweight"].shape[0] == 256 * 4 // torch.iinfo(dtype).bits
    assert torch.equal(fmt.dequantize(t), ref.dequantize(ref.quantize(w)))


def test_three_bit_is_int32_only() -> None:
    with pytest.raises(TensorFormatError, match="3 int32 lanes"):
        GPTQ(bits=3, pack_dtype=torch.int16)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda t: t.pop("scales"), "missing tensor.*scales"),
        (lambda t: t.update(qweight=t["qweight"][:-1]), "qweight: 23 rows is not a multiple of 3"),
        (lambda t: t.update(qweight=t["qweight"][:-6]), "scales: expected shape"),
        (lambda t: t.update(qzeros=t["qzeros"].to(torch.int64)), "qzeros: expected dtype int32"),
        (lambda t: t.update(scales=t["scales"][:, :-8]), "scales: expected shape"),
        (lambda t: t.update(g_idx=t["g_idx"] + 10), r"g_idx: expected values in \[0, 4\)"),
        (lambda t: t.update(extra=t["scales"]), "unexpected tensor.*extra"),
    ],
)
def test_malformed_tensors_name_the_tensor(change, match: str) -> None:
    fmt = GPTQ(bits=3, group_size=64, sym=False)
    t = fmt.quantize(_weight())
    change(t)
    with pytest.raises(TensorFormatError, match=match):
        fmt.validate(t)


def test_group_size_must_divide_in_features() -> None:
    with pytest.raises(TensorFormatError, match="group_size=96 does not divide in_features=256"):
        GPTQ(bits=4, group_size=96).quantize(_weight())


def test_unknown_bits() -> None:
    with pytest.raises(TensorFormatError, match=r"bits: expected one of \(2, 3, 4, 8\), got 5"):
        GPTQ(bits=5)
