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
  can recover them (the "bug in common implementations" of docs/formats/gptq.md);
* GPTQModel's v2 → v1 export subtracts ``0x11111111`` (4-bit) from the whole lane, so
  the −1 borrows from the next field up; its loader adds the constant back, which undoes
  the borrow. Read field by field, that neighbour comes out one too low;
* kernels that add 1 without wrapping (exllama-style v1 readers) read ``2^b`` — a zero
  outside the code range.

quantcore writes v1 field by field with wrap-around, and the format reads it that way:
it is the definition ("each field stores z − 1"), it is the only rule that is defined
for 3-bit fields that straddle lanes (GPTQModel itself shifts decoded fields, with the
same mask, for 3-bit), and it is exact for every zero value. For checkpoints with no
zero of 0 — every symmetric one, and nearly every asymmetric one — all readers above
agree. Asymmetric checkpoints are best kept in v2, where the question never arises.

**Reading a checkpoint as its writer wrote it.** Where the config names the producer,
the loader (:mod:`quantcore.checkpoint.producer`) reads GPTQModel's (and AutoGPTQ ≥ 0.8's,
the same exporter) 2/4/8-bit v1 lanes with :func:`v1_lanes_to_v2` — its loader's lane
arithmetic, done field by field with the carry — and converts them to v2 before any
kernel sees them. Where it does not, fields are read one by one, and
:func:`ambiguous_v1_lanes` counts the lanes on which the writers disagree (a zero of 0
below the lane's top field) so the loader can say so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import torch

from ..packing import pack_codes, unpack_codes

if TYPE_CHECKING:
    from .format import GPTQ

__all__ = ["ambiguous_v1_lanes", "convert_checkpoint_format", "stored_to_zero", "v1_lanes_to_v2", "zero_to_stored"]


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


def _fields_by_lane(qzeros: torch.Tensor, fmt: GPTQ) -> torch.Tensor:
    """The unpacked qzeros fields as ``[G, lane groups, fields per group]``: one lane per
    group at 2/4/8 bits, three lanes of 32 fields at 3 bits."""
    fields = unpack_codes(qzeros, fmt.bits, dim=1)
    per = fmt.geometry.codes
    return fields.reshape(fields.shape[0], -1, per)


def v1_lanes_to_v2(fmt: GPTQ, tensors: Mapping[str, torch.Tensor]) -> tuple[GPTQ, dict[str, torch.Tensor]]:
    """A v1 checkpoint written by lane arithmetic (GPTQModel's export: the v2 lane minus
    ``0x…1111``, borrows included) as the v2 checkpoint it came from.

    Adds 1 to every field with the carry into the next field, and drops the carry out of
    the lane's top field: exactly ``lane + 0x…1111`` modulo 2^W, the inverse of the
    exporter, so a zero of 0 anywhere in a lane comes back with its neighbours intact.
    2/4/8-bit only: 3-bit fields straddle lanes, and GPTQModel shifts them field by field.
    """
    if fmt.checkpoint_format != "v1":
        raise ValueError(f"{fmt.slug}: not a v1 checkpoint")
    if fmt.geometry.lanes != 1:
        raise ValueError(f"{fmt.slug}: lane arithmetic is defined for 2/4/8-bit lanes only")
    fmt.validate(tensors)
    lanes = _fields_by_lane(tensors["qzeros"], fmt)
    out = torch.empty_like(lanes)
    carry = torch.ones_like(lanes[..., 0])  # the +1 of the lowest field
    for j in range(lanes.shape[-1]):
        total = lanes[..., j] + carry
        out[..., j] = total & fmt.maxq
        carry = (total >> fmt.bits) + (1 if j + 1 < lanes.shape[-1] else 0)
    zeros = out.reshape(out.shape[0], -1)
    target = dataclasses.replace(fmt, checkpoint_format="v2")
    converted = dict(tensors)
    converted["qzeros"] = pack_codes(zeros, fmt.bits, dim=1, lane_dtype=fmt.pack_dtype)
    return target, converted


def ambiguous_v1_lanes(fmt: GPTQ, qzeros: torch.Tensor) -> int:
    """How many lanes (lane groups at 3 bits) of a v1 ``qzeros`` hold the field ``2^b − 1``
    — a zero of 0 by the per-field rule — below their top field: there a lane writer
    would have borrowed from the field above, and AutoGPTQ ≤ 0.7's packer would have set
    every field above to ones, so the writers' readings differ."""
    lanes = _fields_by_lane(qzeros, fmt)
    return int((lanes[..., :-1] == fmt.maxq).any(dim=-1).sum())
