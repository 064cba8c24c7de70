"""The pair-interleaved GPTQ words (quantcore/kernels/gptq_pairs/layout.py) that
triton_int4 and hopper_wgmma read: hand-written golden words and the bit-exact round trip."""

from __future__ import annotations

import pytest
import torch

from quantcore.kernels.gptq_pairs.layout import deinterleave_codes, field_inputs, interleave_codes


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
