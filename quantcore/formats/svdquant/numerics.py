"""The golden numerics of the SVDQuant activation format, in plain torch.

Written from the rules in :mod:`.format` (the spec, with the project's choices) and
meant to be read, not to be fast: E2M1 codes are found by measuring the distance to
every grid point, fp8 scales by torch's own ``float8_e4m3fn`` conversion, INT4 codes by
``torch.round``. The kernels reach the same bytes by other routes (threshold
comparisons, integer bit manipulation); the conformance matrix compares them exactly.

Every quantity that decides a code is one IEEE float32 operation (a product, a quotient)
on exact inputs, so it is the same on every device that rounds float32 correctly.
"""

from __future__ import annotations

import torch

from ...errors import TensorFormatError
from ...tensors import describe
from ...tensors import ieee_div as fdiv

__all__ = [
    "CONVENTIONS",
    "E2M1_GRID",
    "E4M3_MAX",
    "E4M3_MIN_NORMAL",
    "E4M3_MIN_SUBNORMAL",
    "FP8_NAN_BITS",
    "FP16_NAN_BITS",
    "INT4_SCALE_FLOOR",
    "dequantize_activation",
    "e2m1_codes",
    "e2m1_values",
    "e4m3_round",
    "fdiv",
    "pack_nibbles",
    "padded_rows",
    "quantize_activation",
    "unpack_nibbles",
]

#: E2M1 magnitudes by 3-bit index (sign in bit 3 of the code).
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E4M3_MAX = 448.0
E4M3_MIN_SUBNORMAL = 2.0**-9
#: fp8 e4m3's smallest normal, ``torch.finfo(torch.float8_e4m3fn).tiny``: torchao's scale floor.
E4M3_MIN_NORMAL = 2.0**-6
#: The NVFP4 scale rules the golden quantizer knows: this format's, and torchao 0.18's.
CONVENTIONS = ("quantcore", "torchao")
#: float8_e4m3fn has one NaN per sign; a block with a non-finite element stores +NaN.
FP8_NAN_BITS = 0x7F
#: float16 quiet NaN as torch writes it (``torch.tensor(nan).half()``).
FP16_NAN_BITS = 0x7E00
INT4_SCALE_FLOOR = 1e-10




def padded_rows(m: int, pad_size: int) -> int:
    return -(-m // pad_size) * pad_size


def e4m3_round(s: torch.Tensor) -> torch.Tensor:
    """float32 → float8_e4m3fn, round to nearest even (torch's conversion)."""
    return s.to(torch.float8_e4m3fn)


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """4-bit E2M1 codes (int64) of float32 ``y``: the magnitude goes to the nearest grid
    point, a tie to the even index (0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2,
    3.5 → 4, 5 → 4); beyond 6 it saturates to 6. Bit 3 is the IEEE sign bit of ``y``, so
    −0 and negatives that round to zero give 0x8. NaN is not handled here (the caller
    masks non-finite blocks)."""
    a = y.double().abs().clamp(max=E2M1_GRID[-1])
    best_d = torch.full_like(a, float("inf"))
    best_i = torch.zeros(a.shape, dtype=torch.int64, device=a.device)
    for i, g in enumerate(E2M1_GRID):  # ascending: a tie is between index i-1 and i
        d = (a - g).abs()
        better = (d < best_d) | ((d == best_d) & (i % 2 == 0))
        best_d = torch.where(better, d, best_d)
        best_i = torch.where(better, torch.full_like(best_i, i), best_i)
    return best_i | (torch.signbit(y).to(torch.int64) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """float64 values of 4-bit E2M1 codes."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float64, device=codes.device)
    mag = grid[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[..., N]`` codes in 0..15 → ``[..., N/2]`` uint8: element 2j in the low nibble."""
    c = codes.to(torch.int64) & 0xF
    return (c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_nibbles`: ``[..., N]`` int64 codes in 0..15."""
    p = packed.to(torch.int64)
    return torch.stack([p & 0xF, p >> 4], dim=-1).flatten(-2)


def _smoothed(x: torch.Tensor, smooth: torch.Tensor | None) -> torch.Tensor:
    v = x.float()
    if smooth is not None:
        v = v * fdiv(1.0, smooth.float())  # the reciprocal once per column, then a product
    return v


def quantize_activation(
    x: torch.Tensor, smooth: torch.Tensor | None, *, fp4: bool, block: int, pad_size: int,
    convention: str = "quantcore",
) -> dict[str, torch.Tensor]:
    """The golden quantizer: ``{"qout": [M_pad, N/2] uint8, "oscales": [N/block, M_pad]}``
    (float8_e4m3fn for NVFP4, float16 for INT4). See :mod:`.format` for every rule;
    ``convention="torchao"`` swaps in torchao 0.18's NVFP4 scale floor and reciprocal."""
    if x.dim() != 2 or x.dtype not in (torch.float16, torch.bfloat16):
        raise TensorFormatError(f"x: expected a 2-D float16/bfloat16 [M, N] tensor, got {describe(x)}")
    m, n = x.shape
    if n % block:
        raise TensorFormatError(f"x: N={n} is not a multiple of the {'NVFP4' if fp4 else 'INT4'} block {block}")
    v = _smoothed(x, smooth).view(m, n // block, block)
    amax = v.abs().amax(dim=-1)  # NaN if the block has a NaN, inf if it has an inf
    bad = ~torch.isfinite(amax)
    if fp4:
        if convention == "torchao":  # every scale clamped to [2⁻⁶, 448], then x · (1 / s8)
            s8 = e4m3_round(fdiv(amax, 6.0).clamp(min=E4M3_MIN_NORMAL, max=E4M3_MAX))
            codes = e2m1_codes(v * fdiv(1.0, s8.float()).unsqueeze(-1))
        else:
            s8 = e4m3_round(fdiv(amax, 6.0).clamp(max=E4M3_MAX))
            # In float32, then back: every value is an e4m3 one, so the round trip is exact
            # (older torch has no torch.where for the 8-bit floats).
            s8 = torch.where(s8.float() == 0, E4M3_MIN_SUBNORMAL, s8.float()).to(torch.float8_e4m3fn)
            codes = e2m1_codes(v / s8.float().unsqueeze(-1))
        scale_bits = s8.view(torch.uint8).to(torch.int64)
        scale_bits = torch.where(bad, FP8_NAN_BITS, scale_bits)
        keep = ~bad
    else:
        r = fdiv(7.0, amax)  # inf for an all-zero block (or one too small for float32)
        q = torch.round(v * r.unsqueeze(-1)).clamp(-8, 7)
        keep = ~bad & torch.isfinite(r)
        codes = torch.where(keep.unsqueeze(-1), q, torch.zeros_like(q)).to(torch.int64) & 0xF
        scale = fdiv(amax, 7.0).clamp_min(INT4_SCALE_FLOOR).to(torch.float16)
        scale_bits = torch.where(bad, FP16_NAN_BITS, scale.view(torch.int16).to(torch.int64))
    codes = torch.where(keep.unsqueeze(-1), codes, torch.zeros_like(codes)).view(m, n)
    m_pad = padded_rows(m, pad_size)
    qout = torch.zeros(m_pad, n // 2, dtype=torch.uint8, device=x.device)
    qout[:m] = pack_nibbles(codes)
    bits = torch.zeros(n // block, m_pad, dtype=torch.int64, device=x.device)
    bits[:, :m] = scale_bits.T
    if fp4:
        oscales = bits.to(torch.uint8).view(torch.float8_e4m3fn)
    else:
        oscales = bits.to(torch.int16).view(torch.float16)  # 0x7E00 fits; negatives do not occur
    return {"qout": qout, "oscales": oscales}


def dequantize_activation(
    qout: torch.Tensor, oscales: torch.Tensor, *, fp4: bool, block: int
) -> torch.Tensor:
    """``code × scale`` in float64, ``[M_pad, N]`` (the smoothed activation x / smooth)."""
    codes = unpack_nibbles(qout)
    vals = e2m1_values(codes) if fp4 else torch.where(codes >= 8, codes - 16, codes).double()
    scales = oscales.double().T.repeat_interleave(block, dim=1)
    return vals * scales
