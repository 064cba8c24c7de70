"""Index packing: two 4-bit codebook indices per byte, as the checkpoint stores them.
Its own module so the quantizer and the format both import it without importing each other."""

from __future__ import annotations

import torch

__all__ = ["pack_indices", "unpack_indices"]


def pack_indices(idx: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` indices in ``[0, 16)`` → ``[N, K/2]`` uint8, column 2j in the low nibble."""
    idx = idx.to(torch.int32)
    return (idx[:, 0::2] | (idx[:, 1::2] << 4)).to(torch.uint8)


def unpack_indices(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_indices`: ``[N, K]`` int64."""
    p = packed.to(torch.int64)
    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(p.shape[0], -1)
