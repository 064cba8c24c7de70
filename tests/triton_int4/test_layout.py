"""The triton_int4 layout: hand-written golden words, the bit-exact round trip, bytes."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.triton_int4.layout import (
    GPTQToTritonInt,
    deinterleave_codes,
    field_inputs,
    interleave_codes,
    sub_group_size,
)
from quantcore.errors import UnsupportedProblemError
from quantcore.formats.gptq import GPTQ


def test_field_inputs_by_hand() -> None:
    """4-bit: field f of word c is input (f mod 4)·32 + 2c + f div 4; 8-bit: (f mod 2)·32 + 2c + f div 2."""
    four = field_inputs(4)
    assert four[:, 0].tolist() == [0, 32, 64, 96, 1, 33, 65, 97]
    assert four[:, 5].tolist() == [10, 42, 74, 106, 11, 43, 75, 107]
    assert field_inputs(8)[:, 15].tolist() == [30, 62, 31, 63]
    for bits, bk in ((4, 128), (8, 64)):
        assert sorted(field_inputs(bits).flatten().tolist()) == list(range(bk))


def test_golden_words_4bit() -> None:
    """Word 0 of a block holds inputs 0, 32, 64, 96 in its low half and 1, 33, 65, 97 in
    its high half, one nibble each, lowest field lowest."""
    codes = torch.zeros(1, 128, dtype=torch.int32)
    for k, q in {0: 1, 32: 2, 64: 3, 96: 4, 1: 5, 33: 6, 65: 7, 97: 15, 2: 9}.items():
        codes[0, k] = q
    words = interleave_codes(codes, 4)
    assert words.shape == (1, 16)
    assert words[0, 0].item() & 0xFFFFFFFF == 0xF7654321
    assert words[0, 1].item() == 9
    # Viewed as int16, element e holds input e of every slice: (q, q+32·1, ...) in its nibbles.
    assert words.view(torch.int16)[0, :3].tolist() == [0x4321, 0xF765 - 0x10000, 9]


def test_golden_words_8bit() -> None:
    codes = torch.zeros(1, 64, dtype=torch.int32)
    codes[0, 0], codes[0, 32], codes[0, 1], codes[0, 33] = 0x11, 0x22, 0x33, 0xFF
    assert interleave_codes(codes, 8)[0, 0].item() & 0xFFFFFFFF == 0xFF332211


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k", [64, 96, 128, 320, 1000])
def test_interleave_round_trip(bits: int, k: int) -> None:
    k -= k % (32 // bits)
    codes = torch.randint(0, 1 << bits, (24, k), generator=torch.Generator().manual_seed(k), dtype=torch.int32)
    words = interleave_codes(codes, bits)
    assert words.shape[1] * 32 // bits % (512 // bits) == 0  # whole blocks of 16 words
    assert torch.equal(deinterleave_codes(words, bits, k), codes)


FORMATS = [
    GPTQ(bits=4, group_size=128),
    GPTQ(bits=4, group_size=32, sym=False),
    GPTQ(bits=4, group_size=64, sym=False, desc_act=True, checkpoint_format="v1"),
    GPTQ(bits=4, group_size=-1, desc_act=True),
    GPTQ(bits=8, group_size=128, sym=False),
    GPTQ(bits=8, group_size=-1),
    GPTQ(bits=4, group_size=32, pack_dtype=torch.int16, sym=False),
]


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


@pytest.mark.parametrize(("bits", "group_size", "sym"), [(4, 128, True), (4, 32, False), (8, 128, False), (4, -1, True)])
def test_prepared_bytes_within_a_tenth_of_the_checkpoint(bits: int, group_size: int, sym: bool) -> None:
    fmt = GPTQ(bits=bits, group_size=group_size, sym=sym)
    src = fmt.quantize(torch.randn(512, 1024, generator=torch.Generator().manual_seed(0)) * 0.05)
    stored = sum(t.numel() * t.element_size() for t in src.values())
    assert GPTQToTritonInt(fmt).apply(src).nbytes() <= 1.1 * stored
