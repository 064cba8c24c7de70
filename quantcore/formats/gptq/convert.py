"""GPTQ v1 ↔ v2: the two ways a checkpoint stores its zero points.

v2 (``checkpoint_format="gptq_v2"``) stores the zero point z in each b-bit field of
``qzeros``. v1 (``"gptq"``, AutoGPTQ's original layout) stores ``z − 1``; its kernels
add 1 back when they read. Only ``qzeros`` differs; ``qweight``, ``scales`` and
``g_idx`` are the same bytes in both.

**A zero of 0 in v1.** ``z − 1 = −1`` does not fit b unsigned bits. What a v1 file
holds then depends on the writer:

* a writer that masks each field (this module) stores ``2^b − 1``; reading the field
  as ``(stored + 1) mod 2^b`` gives 0 back, so every zero in ``[0, 2^b)`` round-trips;
* AutoGPTQ's packer casts ``−1`` to uint32 and ORs it in shifted, which sets every
  higher field of the lane to all ones as well: those neighbours are lost, no reader
  can recover them (the "bug in common implementations" of seeds/gptq-storage-format.md);
* GPTQModel's v2 → v1 export subtracts ``0x11111111`` (4-bit) from the whole lane, so
  the −1 borrows from the next field up; its loader adds the constant back, which undoes
  the borrow. Read field by field, that neighbour comes out one too low;
* kernels that add 1 without wrapping (exllama-style v1 readers) read ``2^b`` — a zero
  outside the code range.

quantcore reads and writes v1 field by field with wrap-around. It is the definition
("each field stores z − 1"), it is the only rule that is defined for 3-bit fields that
straddle lanes (GPTQModel itself shifts decoded fields, with the same mask, for 3-bit
and in its newer v1 correction), and it is exact for every zero value. For checkpoints
with no zero of 0 — every symmetric one, and nearly every asymmetric one — all readers
above agree. Asymmetric checkpoints are best kept in v2, where the question never arises.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import torch

from ..packing import pack_codes, unpack_codes

if TYPE_CHECKING:
    from .format import GPTQ

__all__ = ["convert_checkpoint_format", "stored_to_zero", "zero_to_stored"]


def stored_to_zero(stored: torch.Tensor, fmt: GPTQ) -> torch.Tensor:
    """Unpacked qzeros fields → true zero points (v1: ``(stored + 1) mod 2^b``)."""
    return (stored + 1) & fmt.maxq if fmt.checkpoint_format == "v1" else stored


def zero_to_stored(zero: torch.Tensor, fmt: GPTQ) -> torch.Tensor:
    """True zero points → the fields a ``fmt`` checkpoint stores (v1: ``(z − 1) mod 2^b``)."""
    return (zero - 1) & fmt.maxq if fmt.checkpoint_format == "v1" else zero


def convert_checkpoint_format(
    fmt: GPTQ, tensors: Mapping[str, torch.Tensor], to: Literal["v1", "v2", "gptq", "gptq_v2"]
) -> tuple[GPTQ, dict[str, torch.Tensor]]:
    """The same checkpoint in the other zero-point convention: ``(new format, tensors)``.

    Lossless both ways for every zero in ``[0, 2^b)``; only ``qzeros`` changes.
    """
    target = dataclasses.replace(fmt, checkpoint_format=to)  # type: ignore[arg-type]
    fmt.validate(tensors)
    out = dict(tensors)
    if target.checkpoint_format != fmt.checkpoint_format:
        zeros = stored_to_zero(unpack_codes(tensors["qzeros"], fmt.bits, dim=1), fmt)
        out["qzeros"] = pack_codes(
            zero_to_stored(zeros, target), fmt.bits, dim=1, lane_dtype=fmt.pack_dtype
        )
    return target, out
