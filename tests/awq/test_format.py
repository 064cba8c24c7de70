"""AWQ GEMM layout: nibble order golden vectors, quantize/dequantize, validation."""

from __future__ import annotations

import pytest
import torch

from quantcore.errors import TensorFormatError
from quantcore.formats.awq import AWQ, AWQ_ORDER, AWQ_REVERSE_ORDER, pack_awq, unpack_awq


def _weight(o: int = 64, i: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randn(o, i, generator=torch.Generator().manual_seed(seed)) * 0.05


def test_order_tables_are_inverse() -> None:
    assert [AWQ_ORDER[AWQ_REVERSE_ORDER[k]] for k in range(8)] == list(range(8))


def test_golden_lane() -> None:
    """Columns 0..7 holding codes 1..8: nibble p holds column AWQ_ORDER[p], i.e. the lane
    reads, from nibble 7 down to 0, columns 7 5 3 1 6 4 2 0 → codes 8 6 4 2 7 5 3 1."""
    codes = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    lane = pack_awq(codes)
    assert lane.item() == 0x86427531 - 2**32
    assert torch.equal(unpack_awq(lane), codes.int())


def test_golden_dequantize_tiny() -> None:
    """I = 8, O = 8, one group; codes q[i, o] = (i + o) % 16, zero 3, scale 0.5."""
    q = (torch.arange(8).unsqueeze(1) + torch.arange(8).unsqueeze(0)) % 16
    t = {
        "qweight": pack_awq(q),
        "qzeros": pack_awq(torch.full((1, 8), 3)),
        "scales": torch.full((1, 8), 0.5, dtype=torch.float16),
    }
    assert torch.equal(AWQ(group_size=-1).dequantize(t), ((q - 3) * 0.5).T.double())


@pytest.mark.parametrize("zero_point", [True, False])
@pytest.mark.parametrize("group_size", [32, 128, -1])
def test_quantize_round_trip(zero_point: bool, group_size: int) -> None:
    fmt = AWQ(group_size=group_size, zero_point=zero_point)
    w = _weight()
    t = fmt.quantize(w)
    g = 256 // (256 if group_size == -1 else group_size)
    assert t["qweight"].shape == (256, 8) and t["qzeros"].shape == (g, 8) and t["scales"].shape == (g, 64)
    step = t["scales"].float().repeat_interleave(256 // g, dim=0).T
    err = (fmt.dequantize(t).float() - w).abs()
    assert (err <= step * (1.0 if zero_point else 0.51)).all()
    if not zero_point:
        assert (fmt.unpack_zeros(t) == 8).all()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda t: t.pop("qzeros"), "missing tensor.*qzeros"),
        (lambda t: t.update(qweight=t["qweight"].T.contiguous()), "does not divide in_features=8|scales: expected shape"),
        (lambda t: t.update(scales=t["scales"].to(torch.int32)), "scales: expected dtype"),
        (lambda t: t.update(qzeros=t["qzeros"][:, :-1]), r"qzeros: expected shape \(2, 8\)"),
        (lambda t: t.update(g_idx=torch.zeros(256)), "unexpected tensor.*g_idx"),
    ],
)
def test_malformed(change, match: str) -> None:
    fmt = AWQ(group_size=128)
    t = fmt.quantize(_weight())
    change(t)
    with pytest.raises(TensorFormatError, match=match):
        fmt.validate(t)


def test_only_gemm_and_4_bits() -> None:
    with pytest.raises(TensorFormatError, match="version"):
        AWQ(layout="gemv")
    with pytest.raises(TensorFormatError, match="bits"):
        AWQ(bits=3)
