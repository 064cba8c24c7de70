"""GPTQ codes as pair-interleaved blocks of words: the word layout the ``triton_int4`` and
``hopper_wgmma`` kernels read (each then arranges the words its own way).

The sorted inputs of each output row are read one **block** at a time: 128 inputs at 4
bits, 64 at 8 bits, so that one block of one output row is always 16 int32 words (64
bytes). A block is cut into **slices** of 32 consecutive inputs (4 slices at 4 bits, 2
at 8), and the codes of a slice sit in the 16 words as *pairs*: word ``c`` holds inputs
``2c`` and ``2c + 1`` of slice ``i`` in fields ``i`` and ``i + PAIRS`` — 16 bits apart.
So field ``f`` (bits ``[b·f, b·f + b)``) of word ``c`` is input

    k = block·BK + (f mod PAIRS)·32 + 2c + f div PAIRS,      PAIRS = 16 / b.

Why: one shift and one masked OR of a word give the two codes of a pair as the two
halves of a 32-bit register — ``0x4300 | q`` is bf16 ``128 + q``, ``0x6400 | q`` fp16
``1024 + q`` — which is already the register a tensor-core operand wants (consecutive
inputs, lower one in the low half): no repacking per code (:mod:`.ptx`). Viewed as
int16, element ``e`` of a block row holds input ``e`` of every slice.
"""

from __future__ import annotations

import torch

__all__ = [
    "BLOCK_WORDS",
    "SLICE",
    "SUPPORTED_BITS",
    "block_k",
    "deinterleave_codes",
    "field_inputs",
    "interleave_codes",
    "padded_k",
    "pairs",
]

#: Words of one block of one output row, whatever the bit width (64 bytes).
BLOCK_WORDS = 16
#: Inputs of one slice: the depth of one tensor-core operand.
SLICE = 32
SUPPORTED_BITS = (4, 8)


def block_k(bits: int) -> int:
    """Inputs per block: 128 at 4 bits, 64 at 8 bits."""
    return BLOCK_WORDS * 32 // bits


def pairs(bits: int) -> int:
    """Slices per block (pairs of fields per word): 4 at 4 bits, 2 at 8 bits."""
    return 16 // bits


def padded_k(k: int, bits: int) -> int:
    """``k`` rounded up to whole blocks."""
    bk = block_k(bits)
    return -(-k // bk) * bk


def field_inputs(bits: int) -> torch.Tensor:
    """``[F, 16]``: the input (within its block) of field f of word c."""
    p = pairs(bits)
    f = torch.arange(32 // bits).view(-1, 1)
    c = torch.arange(BLOCK_WORDS).view(1, -1)
    return (f % p) * SLICE + 2 * c + f // p


def interleave_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes ``[N, K]`` (``0 ≤ q < 2^b``) → int32 words ``[N, Kp·b/32]`` in block-pair order
    (module docstring), ``Kp`` = K rounded up to a block; codes past K are 0."""
    n, k = codes.shape
    kp, bk = padded_k(k, bits), block_k(bits)
    c = torch.zeros(n, kp, dtype=torch.int64, device=codes.device)
    c[:, :k] = codes.to(torch.int64)
    c = c.view(n, kp // bk, bk)
    where = field_inputs(bits).to(codes.device)
    words = torch.zeros(n, kp // bk, BLOCK_WORDS, dtype=torch.int64, device=codes.device)
    for f in range(32 // bits):
        words |= c[:, :, where[f]] << (bits * f)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).reshape(n, kp * bits // 32).contiguous()


def deinterleave_codes(words: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """Inverse of :func:`interleave_codes`: int32 codes ``[N, K]``."""
    n = words.shape[0]
    bk = block_k(bits)
    w = words.to(torch.int64).view(n, -1, BLOCK_WORDS) & 0xFFFFFFFF
    codes = torch.zeros(n, w.shape[1], bk, dtype=torch.int64, device=words.device)
    where = field_inputs(bits).to(words.device)
    for f in range(32 // bits):
        codes[:, :, where[f]] = (w >> (bits * f)) & ((1 << bits) - 1)
    return codes.reshape(n, -1)[:, :k].to(torch.int32).contiguous()
