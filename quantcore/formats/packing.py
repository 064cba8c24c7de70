"""Packing b-bit codes into integer lanes and back, for bit widths that divide the lane.

Lane layout (GPTQ, and AWQ before its column shuffle): the code at position ``j`` of a
lane sits in bits ``[b·j, b·j + b)`` — the lowest-numbered element in the lowest bits.
Lanes are stored in a signed dtype (int32 by default); the bit pattern is what counts,
so values are wrapped two's-complement style on the way in.
"""

from __future__ import annotations

import torch

__all__ = ["LANE_BITS", "pack_codes", "unpack_codes"]

LANE_BITS = {torch.int8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}


def _check(bits: int, lane_dtype: torch.dtype) -> int:
    if lane_dtype not in LANE_BITS:
        raise ValueError(f"pack_dtype: expected one of int8/16/32/64, got {lane_dtype}")
    width = LANE_BITS[lane_dtype]
    if bits <= 0 or width % bits:
        raise ValueError(f"bits: expected a divisor of {width} for {lane_dtype}, got {bits}")
    return width // bits


def pack_codes(
    codes: torch.Tensor, bits: int, *, dim: int, lane_dtype: torch.dtype = torch.int32
) -> torch.Tensor:
    """Pack unsigned codes (``0 <= c < 2**bits``) along ``dim`` into lanes.

    ``codes.shape[dim]`` must be a multiple of the codes per lane; the packed dim
    shrinks by that factor.
    """
    per_lane = _check(bits, lane_dtype)
    dim = dim % codes.dim()
    n = codes.shape[dim]
    if n % per_lane:
        raise ValueError(f"codes: dim {dim} has {n} entries, not a multiple of {per_lane}")
    c = codes.to(torch.int64).movedim(dim, -1)
    c = c.reshape(*c.shape[:-1], n // per_lane, per_lane)
    shifts = torch.arange(per_lane, dtype=torch.int64, device=codes.device) * bits
    width = LANE_BITS[lane_dtype]
    if width == 64:
        # int64 lanes: build the two 32-bit halves so no shift overflows a signed int64.
        half = per_lane // 2
        lo = (c[..., :half] << shifts[:half]).sum(-1)
        hi = (c[..., half:] << (shifts[half:] - 32)).sum(-1)
        hi = torch.where(hi >= 2**31, hi - 2**32, hi)
        lane = (hi << 32) | lo
    else:
        lane = (c << shifts).sum(-1)
        lane = torch.where(lane >= 2 ** (width - 1), lane - 2**width, lane)
    return lane.to(lane_dtype).movedim(-1, dim).contiguous()


def unpack_codes(lanes: torch.Tensor, bits: int, *, dim: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: int32 codes in ``[0, 2**bits)``; ``dim`` grows."""
    per_lane = _check(bits, lanes.dtype)
    dim = dim % lanes.dim()
    # int64 so the mask fits whatever the lane width; the arithmetic shift of a negative
    # lane brings in sign bits only above the code being extracted.
    shifts = torch.arange(per_lane, dtype=torch.int64, device=lanes.device) * bits
    x = lanes.to(torch.int64).movedim(dim, -1).unsqueeze(-1)
    codes = torch.bitwise_and(torch.bitwise_right_shift(x, shifts), (1 << bits) - 1)
    codes = codes.reshape(*codes.shape[:-2], -1).to(torch.int32)
    return codes.movedim(-1, dim).contiguous()
