"""The weight types of TensorRT-LLM's mixed-GEMM preprocessor (``QuantType``).

Each fixes the weight's bit width, the activation type it is paired with (which sets
the threadblock K of the layout) and the LDSM row permutation.
"""

from __future__ import annotations

import enum

__all__ = ["QuantType"]


class QuantType(enum.Enum):
    """``W8_A16``: int8 weights, fp16/bf16 activations. ``W4_A16``: int4 weights (two per
    byte, the even element in the low nibble), fp16/bf16 activations. ``W4_AFP8``: int4
    weights with fp8 activations."""

    W8_A16 = "W8_A16"
    W4_A16 = "W4_A16"
    W4_AFP8 = "W4_AFP8"

    @property
    def bits(self) -> int:
        return 8 if self is QuantType.W8_A16 else 4

    @property
    def activation_bits(self) -> int:
        return 8 if self is QuantType.W4_AFP8 else 16

    @property
    def elements_per_byte(self) -> int:
        return 8 // self.bits

    @property
    def rows_per_mma(self) -> int:
        """``B_ROWS_PER_MMA = 8 · (16 / bits)``: the block the row permutation acts on."""
        return 8 * (16 // self.bits)

    @property
    def row_permutation(self) -> tuple[int, ...]:
        """Output row r of each block takes input row ``perm[r]`` (``get_permutation_map``)."""
        return _PERMUTATIONS[self]


_PERMUTATIONS = {
    QuantType.W8_A16: (0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15),
    QuantType.W4_A16: (
        0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27,
        4, 5, 12, 13, 20, 21, 28, 29, 6, 7, 14, 15, 22, 23, 30, 31,
    ),
    QuantType.W4_AFP8: (
        0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23,
        8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31,
    ),
}
