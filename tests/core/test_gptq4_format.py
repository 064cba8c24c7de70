"""GPTQ 4-bit storage: hand-derived vectors, validation errors, v1/v2, act-order."""

from __future__ import annotations

import pytest
import torch

from quantcore.errors import TensorFormatError
from quantcore.formats.gptq import GPTQ, act_order_g_idx
from quantcore.formats.packing import pack_codes, unpack_codes


def test_lane_layout_by_hand() -> None:
    # Codes 1..8 down one column pack lowest-first: nibble j holds code j.
    codes = torch.arange(1, 9).reshape(8, 1)
    lane = pack_codes(codes, 4, dim=0)
    assert lane.item() == 0x87654321 - 2**32  # stored as signed int32
    assert unpack_codes(lane, 4, dim=0).flatten().tolist() == list(range(1, 9))


def test_tiny_checkpoint_dequantizes_by_hand() -> None:
    # I = 8 inputs, O = 8 outputs, one group; codes q[i, o] = (i + o) % 16.
    q = (torch.arange(8).reshape(8, 1) + torch.arange(8)) % 16
    zeros = torch.tensor([[3, 8, 0, 15, 1, 2, 4, 5]])
    scales = torch.tensor([[0.5, 1, 2, 0.25, 1, 1, 1, 1]], dtype=torch.float16)
    fmt = GPTQ(bits=4, group_size=-1, sym=False)
    tensors = {"qweight": pack_codes(q, 4, dim=0), "qzeros": pack_codes(zeros, 4, dim=1), "scales": scales}
    w = fmt.dequantize(tensors)
    for o in range(8):
        for i in range(8):
            assert w[o, i] == (q[i, o] - zeros[0, o]) * scales[0, o].double()


def test_v1_stores_zero_minus_one_and_zero_of_zero_wraps() -> None:
    zeros = torch.tensor([[0, 1, 7, 15, 8, 2, 3, 4]])
    v1 = GPTQ(group_size=-1, sym=False, checkpoint_format="v1")
    stored = pack_codes((zeros - 1) & 15, 4, dim=1)
    assert unpack_codes(stored, 4, dim=1)[0, 0] == 15  # zero 0 is stored as -1 mod 16
    t = {"qweight": torch.zeros(1, 8, dtype=torch.int32), "qzeros": stored,
         "scales": torch.ones(1, 8, dtype=torch.float16)}
    assert torch.equal(v1.unpack_zeros(t), zeros.int())


@pytest.mark.parametrize("ver", ["v1", "v2"])
@pytest.mark.parametrize("sym", [True, False])
def test_quantizer_round_trips_through_storage(ver: str, sym: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=gen)
    w[:, :32] = w[:, :32].abs()  # a group with min >= 0: asymmetric zero of 0
    fmt = GPTQ(group_size=32, sym=sym, checkpoint_format=ver)
    t = fmt.quantize(w, generator=gen)
    gaussian = slice(32, None)
    err = (fmt.dequantize(t)[:, gaussian] - w[:, gaussian].double()).norm() / w[:, gaussian].norm()
    assert err < 0.12  # 4-bit RTN on Gaussians: about step/sqrt(12) = 0.108 of sigma
    if not sym:
        assert (fmt.unpack_zeros(t)[0] == 0).any()


def test_act_order_g_idx_is_the_processing_order() -> None:
    perm = torch.tensor([3, 0, 2, 1, 5, 4, 7, 6])
    # Processed in order 3, 0, 2, 1 (group 0), then 5, 4, 7, 6 (group 1).
    assert act_order_g_idx(perm, 4).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    perm = torch.tensor([7, 0, 6, 1, 5, 2, 4, 3])
    assert act_order_g_idx(perm, 2).tolist() == [0, 1, 2, 3, 3, 2, 1, 0]


def test_act_order_quantize_groups_follow_the_permutation() -> None:
    gen = torch.Generator().manual_seed(1)
    fmt = GPTQ(group_size=32, desc_act=True, sym=False)
    t = fmt.quantize(torch.randn(32, 128, generator=gen), generator=gen)
    g = t["g_idx"].long()
    assert not torch.equal(g, torch.arange(128) // 32)
    assert torch.bincount(g).tolist() == [32] * 4


def good() -> tuple[GPTQ, dict[str, torch.Tensor]]:
    fmt = GPTQ(group_size=32, sym=False)
    return fmt, fmt.quantize(torch.randn(16, 64, generator=torch.Generator().manual_seed(2)))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.pop("qzeros"), r"missing tensor\(s\) qzeros"),
        (lambda t: t.update(qweight=t["qweight"].float()), r"qweight: expected dtype int32, got \(8, 16\) float32"),
        (lambda t: t.update(scales=t["scales"][:1]), r"scales: expected shape \(2, 16\), got \(1, 16\)"),
        (lambda t: t.update(qzeros=t["qzeros"][:, :1]), r"qzeros: expected shape \(2, 2\)"),
        (lambda t: t.update(g_idx=t["g_idx"][:10]), r"g_idx: expected shape \(64,\)"),
        (lambda t: t.update(g_idx=t["g_idx"] + 5), r"g_idx: expected values in \[0, 2\)"),
        (lambda t: t.update(bias=torch.zeros(3)), r"bias: expected shape \(16,\)"),
        (lambda t: t.update(lora=torch.zeros(3)), r"unexpected tensor\(s\) lora"),
        (lambda t: t.update(scales=t["scales"].clone().fill_(float("nan"))), r"scales: contains NaN"),
        (lambda t: t.update(qweight=t["qweight"][:, :3]), r"out_features = 3 .* multiple of 8"),
    ],
)
def test_validate_names_the_tensor(mutate, message: str) -> None:
    fmt, t = good()
    mutate(t)
    with pytest.raises(TensorFormatError, match=message):
        fmt.validate(t)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"bits": 5}, r"bits: expected one of"),
        ({"group_size": 0}, r"group_size: expected a positive int or -1, got 0"),
        ({"checkpoint_format": "v3"}, r"checkpoint_format: expected v1/gptq or v2/gptq_v2, got 'v3'"),
    ],
)
def test_bad_parameters(params: dict, message: str) -> None:
    with pytest.raises(TensorFormatError, match=message):
        GPTQ(**params)


def test_quantize_refuses_nan_and_misaligned() -> None:
    with pytest.raises(TensorFormatError, match="NaN or Inf"):
        GPTQ().quantize(torch.full((8, 8), float("nan")))
    with pytest.raises(TensorFormatError, match="in_features=12"):
        GPTQ().quantize(torch.randn(8, 12))


def test_from_params_accepts_config_strings() -> None:
    fmt = GPTQ.from_params(bits="4", group_size="-1", sym="false", desc_act="True", checkpoint_format="gptq")
    assert fmt == GPTQ(bits=4, group_size=-1, sym=False, desc_act=True, checkpoint_format="v1")
    assert fmt.slug == "gptq4-gall-asym-act-v1"
