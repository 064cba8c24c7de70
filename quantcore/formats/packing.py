"""Packing b-bit codes into integer lanes and back.

The rule (GPTQ's, and AWQ's before its column shuffle) is a little-endian bit stream:
element ``j`` of a packed run occupies stream bits ``[b·j, b·j + b)``, and lane ``r``
holds stream bits ``[W·r, W·r + W)`` for lanes of W bits. When b divides W every code
sits inside one lane, lowest-numbered element in the lowest bits. When it does not
(3-bit codes in int32 lanes) a block of ``lcm(b, W) / b`` codes fills ``lcm(b, W) / W``
lanes and some codes straddle two lanes: 32 three-bit codes in 3 int32 lanes, code 10
split 2 + 1 bits across lanes 0 and 1, code 21 split 1 + 2 across lanes 1 and 2 —
exactly GPTQ's "10 | 1 | 10 | 1 | 10" loop.

Lanes are stored in a signed dtype (int32 by default); the bit pattern is what counts,
so values are wrapped two's-complement style on the way in.
"""

from __future__ import annotations

import math
import sys

import torch

__all__ = ["LANE_BITS", "PackGeometry", "pack_codes", "packed_length", "unpack_codes"]

LANE_BITS = {torch.int8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}


class PackGeometry:
    """How ``bits``-bit codes tile lanes of ``lane_dtype``: ``codes`` codes per block of
    ``lanes`` lanes (8 per 1 for int4 in int32, 32 per 3 for int3 in int32)."""

    def __init__(self, bits: int, lane_dtype: torch.dtype) -> None:
        if lane_dtype not in LANE_BITS:
            raise ValueError(f"pack_dtype: expected one of int8/16/32/64, got {lane_dtype}")
        if not 1 <= bits <= 16:
            raise ValueError(f"bits: expected 1..16, got {bits}")
        self.bits = bits
        self.lane_dtype = lane_dtype
        self.width = LANE_BITS[lane_dtype]
        block = math.lcm(bits, self.width)
        self.codes = block // bits
        self.lanes = block // self.width

    def packed_length(self, n: int, what: str = "codes") -> int:
        if n % self.codes:
            raise ValueError(
                f"{what}: {n} entries, not a multiple of {self.codes} ({self.bits}-bit codes fill "
                f"{self.lanes} {self.width}-bit lane(s) per {self.codes})"
            )
        return n // self.codes * self.lanes


def packed_length(n: int, bits: int, lane_dtype: torch.dtype = torch.int32) -> int:
    """Number of lanes that ``n`` codes of ``bits`` bits fill."""
    return PackGeometry(bits, lane_dtype).packed_length(n)


def _offsets(geo: PackGeometry, width: int) -> list[tuple[int, int, int]]:
    """(lane, shift, bits in that lane) for each code of a block, in ``width``-bit lanes."""
    out = []
    for j in range(geo.codes):
        start = geo.bits * j
        lane, shift = divmod(start, width)
        out.append((lane, shift, min(geo.bits, width - shift)))
    return out


def pack_codes(
    codes: torch.Tensor, bits: int, *, dim: int, lane_dtype: torch.dtype = torch.int32
) -> torch.Tensor:
    """Pack unsigned codes (``0 <= c < 2**bits``) along ``dim`` into lanes; that dim
    shrinks from n to ``packed_length(n)``."""
    geo = PackGeometry(bits, lane_dtype)
    if geo.width == 64:
        # A 64-bit lane is two consecutive 32-bit lanes of the same stream; building it
        # from halves keeps every shift inside a signed int64.
        halves = pack_codes(codes, bits, dim=dim, lane_dtype=torch.int32).movedim(dim, -1)
        halves = halves.to(torch.int64) & 0xFFFFFFFF
        lo, hi = halves[..., 0::2], halves[..., 1::2]
        hi = torch.where(hi >= 2**31, hi - 2**32, hi)
        return ((hi << 32) | lo).movedim(-1, dim).contiguous()
    dim = dim % codes.dim()
    n = codes.shape[dim]
    geo.packed_length(n)
    c = codes.to(torch.int64).movedim(dim, -1)
    c = c.reshape(*c.shape[:-1], n // geo.codes, geo.codes)
    lanes = torch.zeros(*c.shape[:-1], geo.lanes, dtype=torch.int64, device=codes.device)
    for j, (lane, shift, low_bits) in enumerate(_offsets(geo, geo.width)):
        code = c[..., j]
        lanes[..., lane] |= (code & ((1 << low_bits) - 1)) << shift
        if low_bits < bits:  # the code straddles into the next lane
            lanes[..., lane + 1] |= code >> low_bits
    lanes = lanes.reshape(*lanes.shape[:-2], -1)
    lanes = torch.where(lanes >= 2 ** (geo.width - 1), lanes - 2**geo.width, lanes)
    return lanes.to(lane_dtype).movedim(-1, dim).contiguous()


def unpack_codes(lanes: torch.Tensor, bits: int, *, dim: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: int32 codes in ``[0, 2**bits)``; ``dim`` grows."""
    geo = PackGeometry(bits, lanes.dtype)
    dim = dim % lanes.dim()
    if geo.lanes == 1 and sys.byteorder == "little":
        return _unpack_aligned(lanes, geo, dim)
    x = lanes.to(torch.int64).movedim(dim, -1)
    if geo.width == 64:
        # Split into the two 32-bit halves of the stream (low half first).
        x = torch.stack([x & 0xFFFFFFFF, (x >> 32) & 0xFFFFFFFF], dim=-1).reshape(*x.shape[:-1], -1)
        width = 32
        geo = PackGeometry(bits, torch.int32)
    else:
        width = geo.width
        x = x & ((1 << width) - 1)
    n = x.shape[-1]
    if n % geo.lanes:
        raise ValueError(f"lanes: dim {dim} has {n} lanes, not a multiple of {geo.lanes} for {bits}-bit codes")
    x = x.reshape(*x.shape[:-1], n // geo.lanes, geo.lanes)
    mask = (1 << bits) - 1
    parts = []
    for lane, shift, low_bits in _offsets(geo, width):
        code = (x[..., lane] >> shift) & ((1 << low_bits) - 1)
        if low_bits < bits:
            code = code | ((x[..., lane + 1] << low_bits) & mask)
        parts.append(code)
    codes = torch.stack(parts, dim=-1).reshape(*x.shape[:-2], -1).to(torch.int32)
    return codes.movedim(-1, dim).contiguous()


def _unpack_aligned(lanes: torch.Tensor, geo: PackGeometry, dim: int) -> torch.Tensor:
    """:func:`unpack_codes` when ``bits`` divides the lane width (2, 4, 8-bit codes): every
    code sits inside one lane, so one broadcast shift extracts them all, in int32 (an
    arithmetic shift's sign bits fall outside the mask). A 64-bit lane is its two 32-bit
    halves, low half first, which is how a little-endian int64 reads as int32."""
    x = lanes.movedim(dim, -1)
    if geo.width == 64:
        x = x.contiguous().view(torch.int32)
    elif geo.width < 32:
        x = x.to(torch.int32) & ((1 << geo.width) - 1)
    width = min(geo.width, 32)
    shifts = torch.arange(0, width, geo.bits, dtype=torch.int32, device=lanes.device)
    codes = (x.unsqueeze(-1) >> shifts) & ((1 << geo.bits) - 1)
    return codes.reshape(*x.shape[:-1], -1).movedim(-1, dim).contiguous()
