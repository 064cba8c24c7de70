"""The triton_int4 layout: the bit-exact round trip, sub-groups, refusals, bytes (its words:
tests/core/test_gptq_pairs_layout.py)."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.triton_int4.layout import GPTQToTritonInt, sub_group_size
from quantcore.errors import UnsupportedProblemError
from quantcore.formats.gptq import GPTQ
from tests.gptq_pairs_cases import BYTES_CASES, ROUND_TRIP_FORMATS, prepared_and_stored_bytes

FORMATS = [*ROUND_TRIP_FORMATS, GPTQ(bits=4, group_size=32, pack_dtype=torch.int16, sym=False)]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.slug)
@pytest.mark.parametrize("bias", [False, True])
def test_transform_round_trip(fmt: GPTQ, bias: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    src = fmt.quantize(torch.randn(48, 256, generator=gen) * 0.05, generator=gen)
    if bias:
        src["bias"] = torch.randn(48, generator=gen).half()
    tr = GPTQToTritonInt(fmt)
    dst = tr.apply(src)
    assert (dst.zeros is None) == fmt.sym
    assert (dst.ret_idx is not None) == (fmt.desc_act and fmt.group_size != -1)  # one group: no order to restore
    back = tr.invert(dst)
    assert back.keys() == src.keys()
    for name in src:
        assert torch.equal(back[name], src[name]), name


def test_uneven_groups_use_a_group_map() -> None:
    """A g_idx whose groups hold 64 and 32 inputs: sub-groups of 32, mapped to groups."""
    fmt = GPTQ(bits=4, group_size=32, desc_act=True)
    src = fmt.quantize(torch.randn(16, 96, generator=torch.Generator().manual_seed(0)))
    src["g_idx"] = torch.tensor([0] * 64 + [2] * 32, dtype=torch.int32)[torch.randperm(96)]
    dst = GPTQToTritonInt(fmt).apply(src)
    assert dst.sub_group == 32 and dst.group_map is not None
    assert dst.group_map.tolist()[:3] == [0, 0, 2]
    back = GPTQToTritonInt(fmt).invert(dst)
    assert all(torch.equal(back[k], src[k]) for k in src)


def test_refuses_groups_that_split_a_slice() -> None:
    fmt = GPTQ(bits=4, group_size=16)
    src = fmt.quantize(torch.randn(16, 64, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(UnsupportedProblemError, match="multiples of 32"):
        GPTQToTritonInt(fmt).apply(src)


def test_sub_group_size() -> None:
    assert sub_group_size(torch.zeros(48, dtype=torch.long), 128) == 128  # one group: any size
    assert sub_group_size(torch.arange(256) // 64, 256) == 64
    assert sub_group_size(torch.tensor([0] * 96 + [1] * 32), 128) == 32
    assert sub_group_size(torch.tensor([0] * 48 + [1] * 48), 128) is None


@pytest.mark.parametrize(("bits", "group_size", "sym"), BYTES_CASES)
def test_prepared_bytes_within_a_tenth_of_the_checkpoint(bits: int, group_size: int, sym: bool) -> None:
    prepared, stored = prepared_and_stored_bytes(GPTQToTritonInt, bits, group_size, sym)
    assert prepared <= 1.1 * stored
