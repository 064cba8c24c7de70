"""Hand-derived golden vectors for TensorRT-LLM's preprocessor on the smallest shapes its
checks allow. Each expected byte position below is worked out from the steps in
cutlass_preprocessors.cpp (see the docstrings of the ``preprocess`` modules); a 0 code
(stored 0x80 once biased) fills every other element so a misplaced marker shows."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.trtllm_moe.preprocess import (
    QuantType,
    as_plugin_tensor,
    preprocess_weights_for_mixed_gemm,
)
from quantcore.backends.trtllm_moe.preprocess.nibbles import pack_nibbles, unpack_nibbles


def _bytes(t: torch.Tensor) -> list[int]:
    return (t.reshape(-1).to(torch.int16) & 0xFF).tolist()


# int8, SM 80, K = 64, N = 32: byte(k, n) = (n // 2)·2K + (n % 2)·64 + j, where j is the
# position of row k in its 64-row chunk: rows go 0 8 1 9 2 10 … (LDSM permutation
# 0 1 8 9 2 3 10 11 …, then bytes 1 and 2 of every word swapped).
INT8_SM80 = [
    ((0, 0), 0),
    ((8, 0), 1),
    ((1, 0), 2),
    ((9, 0), 3),
    ((2, 0), 4),
    ((15, 0), 15),
    ((16, 0), 16),
    ((24, 0), 17),
    ((0, 1), 64),
    ((8, 1), 65),
    ((0, 2), 128),
    ((63, 31), 15 * 128 + 64 + 63),
]


@pytest.mark.parametrize(("kn", "position"), INT8_SM80)
def test_int8_sm80_marker_positions(kn: tuple[int, int], position: int) -> None:
    w = torch.zeros(64, 32, dtype=torch.int8)
    w[kn] = 5
    out = _bytes(preprocess_weights_for_mixed_gemm(w, QuantType.W8_A16, 80))
    assert out[position] == 5 + 128
    assert sum(b != 128 for b in out) == 1  # every zero code became 0x80


def test_int8_bias_values() -> None:
    """Signed codes become q + 128 in the same byte: -128 → 0x00, -1 → 0x7F, 127 → 0xFF."""
    w = torch.zeros(64, 32, dtype=torch.int8)
    w[0, 0], w[8, 0], w[1, 0] = -128, -1, 127
    out = _bytes(preprocess_weights_for_mixed_gemm(w, QuantType.W8_A16, 80))
    assert out[:3] == [0x00, 0x7F, 0xFF]


def test_int8_first_chunk_row_order() -> None:
    """The first 16 bytes of column 0 hold rows 0 8 1 9 2 10 3 11 4 12 5 13 6 14 7 15."""
    w = (torch.arange(64, dtype=torch.int16) - 128).to(torch.int8).view(64, 1).expand(64, 32).contiguous()
    out = _bytes(preprocess_weights_for_mixed_gemm(w, QuantType.W8_A16, 80))
    assert out[:16] == [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15]
    assert out[64:80] == out[:16]  # column 1, interleaved after column 0's 64 rows


def test_int8_sm90_is_a_plain_transpose_without_bias() -> None:
    w = torch.zeros(64, 32, dtype=torch.int8)
    w[3, 5] = -7
    out = preprocess_weights_for_mixed_gemm(w, QuantType.W8_A16, 90).reshape(-1)
    assert out[5 * 64 + 3] == -7
    assert int((out != 0).sum()) == 1


def test_moe_force_interleave_maps_sm90_to_sm80() -> None:
    w = torch.randint(-128, 128, (2, 128, 64), dtype=torch.int8, generator=torch.Generator().manual_seed(1))
    forced = preprocess_weights_for_mixed_gemm(w, QuantType.W8_A16, 90, force_interleave=True)
    assert torch.equal(forced, preprocess_weights_for_mixed_gemm(w, QuantType.W8_A16, 80))
    assert not torch.equal(forced, preprocess_weights_for_mixed_gemm(w, QuantType.W8_A16, 90))


def test_experts_are_independent() -> None:
    w = torch.zeros(2, 64, 32, dtype=torch.int8)
    w[1, 8, 0] = 9
    out = _bytes(preprocess_weights_for_mixed_gemm(w, QuantType.W8_A16, 80))
    assert out[64 * 32 + 1] == 9 + 128


# int4 (W4_A16), SM 80, K = 64, N = 64: 4 columns interleave in 32-byte (64-row) tiles;
# nibble i of a word holds, after the register shuffle, source nibble [0 2 4 6 1 3 5 7][i].
# (k, n) → (byte, high nibble?)
INT4_SM80 = [
    ((0, 0), (0, False)),  # row 0 → nibble 0 → nibble 0
    ((1, 0), (2, False)),  # row 1 → nibble 1 → nibble 4 (byte 2, low)
    ((8, 0), (0, True)),  # row 8 → LDSM row 2 → nibble 2 → nibble 1 (byte 0, high)
    ((0, 1), (32, False)),  # second column of the group of 4: after column 0's 32 bytes
    ((0, 4), (128, False)),  # next group of 4 columns: 4 × 32 bytes later
]


@pytest.mark.parametrize(("kn", "where"), INT4_SM80)
def test_int4_sm80_marker_positions(kn: tuple[int, int], where: tuple[int, bool]) -> None:
    codes = torch.zeros(64, 64, dtype=torch.int16)
    codes[kn] = 3
    packed = pack_nibbles(codes & 0xF)  # [K, N/2], even column in the low nibble
    out = unpack_nibbles(preprocess_weights_for_mixed_gemm(packed, QuantType.W4_A16, 80)).reshape(-1)
    byte, high = where
    assert int(out[2 * byte + int(high)]) == 3 + 8
    assert int((out != 8).sum()) == 1  # every zero code became 8


def test_plugin_view_is_fp16_over_the_same_bytes() -> None:
    w = torch.randint(-128, 128, (2, 64, 32), dtype=torch.int8, generator=torch.Generator().manual_seed(2))
    processed = preprocess_weights_for_mixed_gemm(w, QuantType.W8_A16, 80)
    view = as_plugin_tensor(processed)
    assert view.dtype == torch.float16 and tuple(view.shape) == (2, 64, 16)
    assert torch.equal(view.view(torch.int8), processed)
