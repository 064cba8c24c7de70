"""Bit packing: hand-derived golden lanes from the packing rule, and round trips."""

from __future__ import annotations

import pytest
import torch

from quantcore.formats.packing import pack_codes, packed_length, unpack_codes


def _signed(value: int, width: int) -> int:
    return value - (1 << width) if value >= 1 << (width - 1) else value


# (bits, lane dtype, codes along dim 0, expected lanes as unsigned hex) — each written out
# by hand: code j occupies stream bits [bits·j, bits·j + bits), lane r bits [W·r, W·r + W).
GOLDEN = [
    (4, torch.int32, [1, 2, 3, 4, 5, 6, 7, 8], [0x87654321]),
    (2, torch.int8, [3, 0, 1, 2], [0b10_01_00_11]),
    (8, torch.int16, [0x12, 0xAB], [0xAB12]),
    (4, torch.int64, list(range(16)), [0xFEDCBA9876543210]),
    (2, torch.int32, [1] + [0] * 14 + [3], [0xC0000001]),
    # 3-bit: 32 codes in 3 int32 lanes. Code 10 sits at stream bits 30..32: its two low
    # bits are lane 0 bits 30-31, its high bit is lane 1 bit 0.
    (3, torch.int32, [0] * 10 + [7] + [0] * 21, [0xC0000000, 0x00000001, 0x00000000]),
    # Code 21 (= 0b101) sits at bits 63..65: bit 0 → lane 1 bit 31, bits 1-2 → lane 2 bits 0-1.
    (3, torch.int32, [0] * 21 + [5] + [0] * 10, [0x00000000, 0x80000000, 0x00000002]),
    # Code 0 in lane 0 bits 0-2, code 11 at bits 33..35 = lane 1 bits 1-3, code 31 at
    # bits 93..95 = lane 2 bits 29-31.
    (3, torch.int32, [1] + [0] * 10 + [6] + [0] * 19 + [7], [0x00000001, 0x0000000C, 0xE0000000]),
]


@pytest.mark.parametrize(("bits", "dtype", "codes", "lanes"), GOLDEN)
def test_golden_lanes(bits: int, dtype: torch.dtype, codes: list[int], lanes: list[int]) -> None:
    width = torch.iinfo(dtype).bits
    expected = torch.tensor([_signed(v, width) for v in lanes], dtype=dtype)
    got = pack_codes(torch.tensor(codes).unsqueeze(1), bits, dim=0, lane_dtype=dtype)
    assert torch.equal(got[:, 0], expected)
    assert unpack_codes(expected.unsqueeze(1), bits, dim=0)[:, 0].tolist() == codes


def test_three_bit_matches_gptq_ten_one_ten_loop() -> None:
    """The stream rule equals GPTQ's explicit 10 | 1 | 10 | 1 | 10 packing loop."""
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 8, (64, 5), generator=gen)
    expected = torch.zeros(6, 5, dtype=torch.int64)
    for block in range(2):
        c = codes[32 * block : 32 * block + 32]
        row = 3 * block
        for j in range(10):
            expected[row] |= c[j] << (3 * j)
        expected[row] |= (c[10] << 30) & 0xFFFFFFFF
        expected[row + 1] |= (c[10] >> 2) & 1
        for j in range(10):
            expected[row + 1] |= c[11 + j] << (3 * j + 1)
        expected[row + 1] |= (c[21] << 31) & 0xFFFFFFFF
        expected[row + 2] |= (c[21] >> 1) & 3
        for j in range(10):
            expected[row + 2] |= c[22 + j] << (3 * j + 2)
    expected = torch.where(expected >= 2**31, expected - 2**32, expected).to(torch.int32)
    assert torch.equal(pack_codes(codes, 3, dim=0), expected)


LANES = (torch.int8, torch.int16, torch.int32, torch.int64)
# 3-bit codes come in int32 lanes only (the format has no other 3-bit layout).
WIDTHS = [(b, d) for b in (2, 3, 4, 8) for d in LANES if b != 3 or d == torch.int32]


@pytest.mark.parametrize(("bits", "dtype"), WIDTHS)
@pytest.mark.parametrize("dim", [0, 1])
def test_round_trip(bits: int, dtype: torch.dtype, dim: int) -> None:
    n = 64 if bits != 3 else 96
    shape = (n, 24) if dim == 0 else (24, n)
    codes = torch.randint(0, 2**bits, shape, generator=torch.Generator().manual_seed(bits))
    lanes = pack_codes(codes, bits, dim=dim, lane_dtype=dtype)
    assert lanes.dtype == dtype
    assert lanes.shape[dim] == packed_length(n, bits, dtype)
    assert torch.equal(unpack_codes(lanes, bits, dim=dim), codes.to(torch.int32))


def test_three_bit_needs_whole_blocks() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        pack_codes(torch.zeros(16, 2, dtype=torch.int32), 3, dim=0)
