"""Two int4 codes per byte, the even element in the low nibble (TensorRT-LLM's packing)."""

from __future__ import annotations

import torch

__all__ = ["pack_nibbles", "unpack_nibbles"]


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """int8 bytes ``[..., M]`` → raw nibbles ``[..., 2M]`` as int16 in ``[0, 16)``:
    element ``2i`` is byte i's low nibble, ``2i + 1`` its high nibble."""
    b = packed.to(torch.int16) & 0xFF
    return torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)


def pack_nibbles(nibbles: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`unpack_nibbles`: ``[..., 2M]`` values in ``[0, 16)`` → int8 ``[..., M]``."""
    n = nibbles.to(torch.int16).unflatten(-1, (-1, 2))
    byte = (n[..., 0] & 0xF) | ((n[..., 1] & 0xF) << 4)
    return torch.where(byte >= 128, byte - 256, byte).to(torch.int8)
