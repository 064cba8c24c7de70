"""The Triton kernel of ``act_quant_lora``: one source, the format a compile-time switch.

Imported only when a Triton kernel runs (it imports triton). The rules it implements are
the format's (:mod:`quantcore.formats.svdquant.format`); this module is about how.

One read of each input tile feeds both passes. Program ``(i, j)`` owns rows
``[i·BM, (i+1)·BM)`` and the j-th slice of N (``N_PER_PROG`` columns); per ``BM × BN``
tile of x it

1. adds ``x_tile @ lora_down[tile, :]`` to a ``[BM, BR]`` float32 accumulator (``tl.dot``
   on the fp16/bf16 tile as loaded — on Hopper a wgmma reading the pipelined shared
   memory copy of x);
2. quantizes the same tile: ``v = x · rsmooth``, per block ``amax``, the scale, the codes,
   two codes per byte; writes codes and scales.

``MASK_N`` (set by the launcher when the slices do not tile N exactly) masks the columns.
At the end a program writes its LoRA partial: the output itself when there is one slice,
else slice j of a ``[SPLIT, M_pad, R]`` buffer that the caller sums (no atomics:
deterministic). Padding rows (M ≤ row < M_pad) are loaded as zeros and written as zero
bytes.

``INTERPRETED`` (Triton's interpreter on CPU): dot operands in float32 (its bf16 dot is
wrong, notes/triton-interpreter.md) and the block max as an integer max over bit
patterns (a custom-combine reduction runs element by element there). Compiled, the block
max is a NaN-propagating float max of ``|v|`` (``max.NaN``, one instruction per
element). Both give the same amax, NaN when the block holds a NaN.

Exactness. Codes and scales must equal the golden bytes on every device, so each step is
either exact or one correctly rounded float32 operation that the golden performs too:

- fp8 e4m3 rounding of the scale is integer bit manipulation (:func:`e4m3_scale_bits`,
  torch's ``float8_e4m3fn`` rounding for the kernel's range [0, 448], its subnormal
  branch in integers too). ``.to(tl.float8e4nv)`` is wrong for ~2% of values under the
  interpreter, and integers need no fp8 hardware.
- E2M1 codes without a division per element: the golden divides, ``y = v / s8``, then
  rounds; here ``|v|`` is compared with ``t · s8`` for the thresholds t (0.25, 0.75,
  1.25, 1.75, 2.5, 3.5, 5). ``t · s8`` is exact (≤ 3 + 4 significant bits), and a
  correctly rounded ``v / s8`` never rounds *onto* t unless ``v == t · s8`` (its distance
  from t is ``ulp(v) / s8 > ulp(t) / 2`` since s8's significand is below 2), so
  ``fl(v / s8) ⋚ t ⇔ v ⋚ t · s8`` exactly, ties included. A three-level comparison tree
  finds the index; its comparisons are materialised as 0.0/1.0 and the next thresholds
  picked with exact fmas (every sum is a small multiple of s8), which keeps the work on
  the FMA pipe instead of predicate registers. A non-finite block compares against NaN
  thresholds (never true), so its codes come out 0 with no per-element test.
- INT4 rounding: ``y + 1.5·2²³`` in float32 rounds y (|y| ≤ 7) to an integer, ties to
  even, and its low four bits are the two's-complement nibble. That add must not be
  fused with the product before it (an FMA would skip the product's rounding): kernels
  are launched with ``enable_fp_fusion=False``; the explicit ``tl.fma`` above are exact.
  Per-block divisions (``amax / 6``, ``7 / amax``, ``amax / 7``) use ``tl.math.div_rn``
  (IEEE, not the approximate ``div.full``).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["act_quant_lora_kernel", "e2m1_index", "e4m3_scale_bits", "e4m3_value"]

#: 1.5 · 2²³: adding it to |y| ≤ 2²² rounds y to an integer, ties to even.
ROUND_MAGIC = tl.constexpr(12582912.0)


@triton.jit
def e4m3_scale_bits(s):
    """float8_e4m3fn bits (int32) of a scale ``s`` in [0, 448], round to nearest even,
    bit for bit as torch's ``.to(torch.float8_e4m3fn)`` (c10 ``fp8e4m3fn_from_fp32_value``):
    normals by rounding the mantissa to 3 bits, subnormals (below 2⁻⁶) by rounding
    ``s / 2⁻⁹`` to an integer, both in integers."""
    a = s.to(tl.int32, bitcast=True)
    # normal: rebias the exponent (127 → 7), round the 23-bit mantissa to 3 bits
    normal = (a - 0x3C000000 + 0x7FFFF + ((a >> 20) & 1)) >> 20
    # subnormal: the significand (implicit bit included) shifted right by 141 − exponent,
    # rounded half to even by the same bias trick; shifts beyond 30 leave 0
    e = tl.maximum(a >> 23, 1)
    sig = (a & 0x7FFFFF) | tl.where(a >= 0x800000, 0x800000, 0)
    shift = tl.minimum(141 - e, 30)
    sub = (sig + ((1 << (shift - 1)) - 1) + ((sig >> shift) & 1)) >> shift
    return tl.where(a < 0x3C800000, sub, normal)


@triton.jit
def e4m3_value(bits):
    """The float32 value of non-negative, finite e4m3 bits (int32, 0..0x7E)."""
    e = bits >> 3
    m = bits & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    return tl.where(e == 0, sub, normal)


@triton.jit
def e2m1_index(a, s8):
    """The E2M1 magnitude index (int32, 0..7) of ``fl(a / s8)`` for a ≥ 0 (see the module
    docstring); a NaN ``s8`` gives 0."""
    c2 = (a >= 1.75 * s8).to(tl.float32)
    c1 = (a >= tl.fma(c2, 2.75 * s8, 0.75 * s8)).to(tl.float32)  # 3.5·s8 or 0.75·s8
    t0 = tl.fma(c2, tl.fma(c1, 1.5 * s8, 2.25 * s8), tl.fma(c1, s8, 0.25 * s8))  # 5, 2.5, 1.25, 0.25 (·s8)
    c0 = (a > t0).to(tl.float32)
    idx = tl.fma(c2, 4.0, tl.fma(c1, 2.0, c0))
    return (idx + ROUND_MAGIC).to(tl.int32, bitcast=True) & 0xF


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def act_quant_lora_kernel(
    x_ptr, stride_xm,
    rs_ptr,
    w_ptr,
    q_ptr,
    s_ptr,
    l_ptr,
    M, M_PAD,
    N: tl.constexpr, R: tl.constexpr, N_PER_PROG: tl.constexpr,
    FP4: tl.constexpr, HAS_SMOOTH: tl.constexpr, INTERPRETED: tl.constexpr, MASK_N: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr,
):
    BLOCK: tl.constexpr = 16 if FP4 else 64
    NB: tl.constexpr = BN // BLOCK
    HAS_LORA: tl.constexpr = R > 0
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    real = rows < M
    rows64 = rows.to(tl.int64)
    offs_n = tl.arange(0, BN)
    offs_h = tl.arange(0, BN // 2)
    offs_b = tl.arange(0, NB)
    offs_r = tl.arange(0, BR)
    acc = tl.zeros((BM, BR), dtype=tl.float32)
    n_start = pid_s * N_PER_PROG
    for i in range(0, N_PER_PROG, BN):
        n0 = n_start + i
        cols = n0 + offs_n
        if MASK_N:
            x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :],
                        mask=real[:, None] & (cols < N)[None, :], other=0.0)
        else:
            x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols[None, :], mask=real[:, None], other=0.0)
        if HAS_LORA:
            w_mask = (offs_r < R)[None, :]
            if MASK_N:
                w_mask = w_mask & (cols < N)[:, None]
            w = tl.load(w_ptr + cols[:, None] * R + offs_r[None, :], mask=w_mask, other=0.0)
            if INTERPRETED:
                acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, w, acc)
        v = x.to(tl.float32)
        if HAS_SMOOTH:
            if MASK_N:
                rs = tl.load(rs_ptr + cols, mask=cols < N, other=1.0)
            else:
                rs = tl.load(rs_ptr + cols)
            v = v * rs[None, :]
        vb = tl.reshape(v, (BM, NB, BLOCK))
        vbits = vb.to(tl.int32, bitcast=True)
        if INTERPRETED:  # for |v| the bit patterns order as the values, NaN above Inf
            amax = tl.max(vbits & 0x7FFFFFFF, axis=2).to(tl.float32, bitcast=True)
        else:
            amax = tl.reduce(tl.abs(vb), 2, _max_nan)
        bad = (amax != amax) | (amax == float("inf"))  # the block holds a NaN or an Inf
        if FP4:
            s = tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32))
            sbits = tl.maximum(e4m3_scale_bits(tl.minimum(s, 448.0)), 1)  # a zero scale → 2⁻⁹
            s8 = tl.where(bad, float("nan"), e4m3_value(sbits))
            idx = e2m1_index(tl.abs(vb), s8[:, :, None])
            # Padding rows are zero bytes: their v is ±0 (0 · a negative rsmooth is -0), so
            # the sign is dropped per block there, as for a non-finite block.
            code = idx | ((vbits >> 28) & tl.where(bad | ~real[:, None], 0, 8)[:, :, None])
            sbits = tl.where(bad, 0x7F, sbits)
        else:
            # r = 7 / amax; an all-zero block (r = inf) and one too small for r to be
            # finite get codes 0; 0 is never a divisor and inf never a factor
            nonzero = amax > 0
            r = tl.math.div_rn(tl.full(amax.shape, 7.0, tl.float32), tl.where(nonzero, amax, 1.0))
            dropped = bad | ~nonzero | (r == float("inf"))
            scale = tl.maximum(tl.math.div_rn(amax, tl.full(amax.shape, 7.0, tl.float32)), 1e-10)
            y = vb * tl.where(dropped, 0.0, r)[:, :, None]
            code = (y + ROUND_MAGIC).to(tl.int32, bitcast=True) & 0xF
            code = tl.where(dropped[:, :, None], 0, code)
            sbits = scale.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
            sbits = tl.where(bad, 0x7E00, sbits)
        sbits = tl.where(real[:, None], sbits, 0)
        lo, hi = tl.split(tl.reshape(code, (BM, BN // 2, 2)))
        packed = (lo | (hi << 4)).to(tl.uint8)
        q_cols = n0 // 2 + offs_h
        s_blocks = n0 // BLOCK + offs_b
        q_out = q_ptr + rows64[:, None] * (N // 2) + q_cols[None, :]
        s_out = s_ptr + s_blocks[None, :].to(tl.int64) * M_PAD + rows64[:, None]
        if MASK_N:
            tl.store(q_out, packed, mask=(q_cols < N // 2)[None, :])
            tl.store(s_out, sbits.to(s_ptr.dtype.element_ty), mask=(s_blocks < N // BLOCK)[None, :])
        else:
            tl.store(q_out, packed)
            tl.store(s_out, sbits.to(s_ptr.dtype.element_ty))
    if HAS_LORA:
        out = l_ptr + pid_s.to(tl.int64) * M_PAD * R + rows64[:, None] * R + offs_r[None, :]
        tl.store(out, acc, mask=(offs_r < R)[None, :])
