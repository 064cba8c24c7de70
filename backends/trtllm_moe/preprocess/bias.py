"""Step 4, ``add_bias_and_interleave_quantized_tensor_inplace`` (only for 70 <= arch < 90).

On the whole byte buffer, in order:

int8
    every byte ``b ← b + 128`` (signed [-128, 127] → unsigned [0, 255], same byte), then
    in every 4-byte group bytes 1 and 2 swap: register ``[e3 e2 e1 e0]`` →
    ``[e3 e1 e2 e0]`` (byte 0 is the least significant; little-endian, as on every
    CUDA GPU and x86 host)::

        out[4w + j] = in[4w + (0, 2, 1, 3)[j]] + 128

int4
    every nibble ``+ 8``, then in every 32-bit word the eight nibbles (nibble 0 the
    least significant) are reordered so that destination nibble d takes source nibble
    ``2d`` for d < 4 and ``2(d − 4) + 1`` otherwise: ``[e7 … e0]`` →
    ``[e7 e5 e3 e1 e6 e4 e2 e0]``.

Both make the GPU's unsigned-to-half conversion a couple of bit operations.
"""

from __future__ import annotations

import torch

from .nibbles import pack_nibbles, unpack_nibbles
from .quant_type import QuantType

__all__ = ["add_bias_and_interleave", "remove_bias_and_deinterleave"]

_INT8_ORDER = [0, 2, 1, 3]  # an involution: its own inverse
_INT4_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # destination nibble d ← source nibble _INT4_ORDER[d]
_INT4_INVERSE = [_INT4_ORDER.index(d) for d in range(8)]


def _wrap_int8(v: torch.Tensor) -> torch.Tensor:
    v = v & 0xFF
    return torch.where(v >= 128, v - 256, v).to(torch.int8)


def _reorder(flat: torch.Tensor, order: list[int], width: int) -> torch.Tensor:
    idx = torch.tensor(order, device=flat.device)
    return flat.reshape(-1, width).index_select(1, idx).reshape(-1)


def add_bias_and_interleave(flat: torch.Tensor, quant_type: QuantType) -> torch.Tensor:
    """Flat int8 bytes → flat int8 bytes."""
    if quant_type.bits == 8:
        return _reorder(_wrap_int8(flat.to(torch.int16) + 128), _INT8_ORDER, 4)
    nibbles = (unpack_nibbles(flat) + 8) & 0xF
    return pack_nibbles(_reorder(nibbles, _INT4_ORDER, 8))


def remove_bias_and_deinterleave(flat: torch.Tensor, quant_type: QuantType) -> torch.Tensor:
    """Inverse of :func:`add_bias_and_interleave`."""
    if quant_type.bits == 8:
        return _wrap_int8(_reorder(flat, _INT8_ORDER, 4).to(torch.int16) - 128)
    nibbles = _reorder(unpack_nibbles(flat), _INT4_INVERSE, 8)
    return pack_nibbles((nibbles - 8) & 0xF)
