"""The Triton kernel of ``act_quant_lora``: one source, the format a compile-time switch.

Imported only when a Triton kernel runs (it imports triton). The rules it implements are
the format's (:mod:`quantcore.formats.svdquant.format`); this module is about how.

Work split (stream-K). The work is a flat list of ``ROW_TILES × CHUNKS`` steps, a step
being one ``BM × BN`` tile of x (row tile ``t``, columns ``[c·BN, (c+1)·BN)``), row tile
by row tile. Program ``p`` of ``P`` takes steps ``[⌊p·T/P⌋, ⌊(p+1)·T/P⌋)``, so every
program has the same work to within one step whatever M, N and the SM count (the split
into whole row tiles or fixed N slices left a third of the SMs idle in the last wave).
Per step it

1. adds ``x_tile @ lora_down[cols, :]`` to a ``[BM, BR]`` float32 accumulator (``tl.dot``
   on the tile as loaded: on Hopper a wgmma reading the pipelined shared-memory copy of
   x that the quantizer reads too — one HBM read of x feeds both);
2. quantizes the same tile: ``v = x · rsmooth``, per block ``amax`` (a max tree over a
   thread's 8 consecutive elements — Triton's coalesced register layout — then shuffles
   across the 2 (NVFP4) or 8 (INT4) threads of a block), the scale, the codes; packs
   eight 4-bit codes into a 32-bit word with shifts and stores words; stores the scales.

A row tile whose steps one program ran entirely is written straight to ``lora_act_out``.
A row tile shared by several programs: each writes its partial to slot ``p − p_first``
of the tile's ``[MAXC, BM, R]`` workspace, then takes a ticket on the tile's counter; the
one that draws the last ticket sums the slots in slot order (fixed: the result does not
depend on which program finishes last — no float atomics, deterministic), writes the
output and resets the counter to 0 for the next call.

Padding rows (M ≤ row < M_pad) are loaded as zeros and written as zero bytes.

Switches (compile-time, set by the launcher). ``INTERPRETED``: Triton's interpreter
runs the kernel (docs/triton-interpreter.md), whose ``range()`` cannot take bounds
computed from ``program_id``, so the loops are ``while`` loops there. ``GPU_MATH``: the
dot on the loaded dtype and a NaN-propagating float block max (off under the
interpreter: its bf16 dot is wrong, and its custom-combine reductions are slow, so
float32 dot operands and an integer max over bit patterns). ``PTX`` (compiled for CUDA):
``amax / 6`` and ``amax / 7`` by one Markstein correction step (:func:`div6_rn`; the
interpreter's ``fma`` is a product then a sum, two roundings) and the scale through the
GPU's ``cvt.rn.satfinite.e4m3x2.f32`` (the interpreter's fp8 cast is wrong for ~2 % of
values); without it, ``div_rn`` and exact integer fp8 rounding (also Ascend's path).
``TREE``: which E2M1 comparison tree (:func:`e2m1_code`).

Exactness. Codes and scales must equal the golden bytes on every device, so each step is
either exact or one correctly rounded float32 operation that the golden performs too:

- the fp8 scale: ``e4m3(fl(amax / 6))``. The hardware conversion and the integer path
  (:func:`e4m3_scale_bits`) both round to nearest even exactly as torch does.
- E2M1 codes without a division per element: the golden divides, ``y = v / s8``, then
  rounds; here ``|v|`` is compared with ``t · s8`` for the thresholds t (0.25, 0.75,
  1.25, 1.75, 2.5, 3.5, 5). ``t · s8`` is exact (≤ 3 + 4 significant bits), and a
  correctly rounded ``v / s8`` never rounds *onto* t unless ``v == t · s8`` (its distance
  from t is ``ulp(v) / s8 > ulp(t) / 2`` since s8's significand is below 2), so
  ``fl(v / s8) ⋚ t ⇔ v ⋚ t · s8`` exactly, ties included. The threshold products are
  made once per block; per element a three-level tree of comparisons and exact fmas or
  selects (no branches) finds the index. A non-finite block has NaN thresholds (never compared
  true), so its codes come out 0 with no per-element test.
- INT4 rounding: ``y + 1.5·2²³`` in float32 rounds y (|y| ≤ 7) to an integer, ties to
  even, and its low four bits are the two's-complement nibble. That add must not be
  fused with the product before it (an FMA would skip the product's rounding): kernels
  are launched with ``enable_fp_fusion=False``; the explicit ``tl.fma`` are exact or
  the Markstein step, which relies on the fusion.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...triton.interpreter import serialize_launches

serialize_launches()  # the interpreter's launches share module state: one at a time

__all__ = ["act_quant_lora_kernel", "div6_rn", "div7_rn", "e2m1_code", "e2m1_index", "e4m3_scale_bits", "e4m3_value"]

#: 1.5 · 2²³: adding it to |y| ≤ 2²² rounds y to an integer, ties to even.
ROUND_MAGIC = tl.constexpr(12582912.0)
#: fl(1/6) = 0x3E2AAAAB and fl(1/7) = 0x3E124925.
RCP6 = tl.constexpr(0.16666667163372040)
RCP7 = tl.constexpr(0.14285714924335480)


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
def div6_rn(a):
    """``fl(a / 6)`` for finite a ≥ 0 without a division: ``q = a · fl(1/6)`` is within an
    ulp, its remainder ``a − 6q`` is exact in one fma, and one correction fma rounds
    correctly (Markstein; checked for every float32 in [0, 2688] by
    ``tests/svdquant/test_div6.py``). Needs a fused fma: compiled code only."""
    q = a * RCP6
    r = tl.fma(q, -6.0, a)
    return tl.fma(r, RCP6, q)


@triton.jit
def div7_rn(a):
    """``fl(a / 7)`` for finite a ≥ 0, as :func:`div6_rn`."""
    q = a * RCP7
    r = tl.fma(q, -7.0, a)
    return tl.fma(r, RCP7, q)


@triton.jit
def e2m1_code(v, s8, TREE: tl.constexpr):
    """The 4-bit E2M1 code (int32) of ``fl(v / s8)``: bit 3 the sign bit of v, bits 0–2
    the magnitude index found by comparing ``a = |v|`` with ``t · s8`` (see the module
    docstring) in a three-level tree — the last level's threshold is picked by the first
    two comparisons; no branches. Ties: ``≥`` at 0.75, 1.75, 3.5 and ``>`` at 0.25, 1.25,
    2.5, 5, so the even index wins. A NaN ``s8`` gives index 0.

    ``TREE`` picks how the comparisons are combined (both exact; the GPU's instruction
    count differs): 0 — predicates and selects; 1 — comparisons as 0.0/1.0 floats, the
    thresholds and the index by exact fmas (every sum a small multiple of s8), the index
    made as the subnormal ``idx · 2⁻¹⁴⁹``, whose bits are idx (10 % faster on the H100)."""
    a = tl.abs(v)
    if TREE == 0:
        c2 = a >= 1.75 * s8
        hi = tl.where(c2, 5.0 * s8, 1.25 * s8)
        lo = tl.where(c2, 2.5 * s8, 0.25 * s8)
        c1 = a >= tl.where(c2, 3.5 * s8, 0.75 * s8)
        c0 = a > tl.where(c1, hi, lo)
        idx = tl.where(c2, 4, 0) + tl.where(c1, 2, 0) + tl.where(c0, 1, 0)
    else:
        c2 = (a >= 1.75 * s8).to(tl.float32)
        c1 = (a >= tl.fma(c2, 2.75 * s8, 0.75 * s8)).to(tl.float32)  # 3.5·s8 or 0.75·s8
        t0 = tl.fma(c1, tl.fma(c2, 1.5 * s8, s8), tl.fma(c2, 2.25 * s8, 0.25 * s8))  # 5, 2.5, 1.25, 0.25 (·s8)
        c0 = (a > t0).to(tl.float32)
        # idx · 2⁻¹⁴⁹ is the subnormal whose bits are idx (exact: small integers)
        # (scalars, which carry no layout: Gluon kernels call this function too)
        d1 = tl.cast(1, tl.int32).to(tl.float32, bitcast=True)  # 2⁻¹⁴⁹ (bits 1, 2, 4)
        d2 = tl.cast(2, tl.int32).to(tl.float32, bitcast=True)
        d4 = tl.cast(4, tl.int32).to(tl.float32, bitcast=True)
        idx = tl.fma(c2, d4, tl.fma(c1, d2, c0 * d1)).to(tl.int32, bitcast=True)
    # v's bits 28–31 shifted down put its sign in bit 3
    sign = (v.to(tl.uint32, bitcast=True) >> 28).to(tl.int32, bitcast=True)
    return idx | (sign & 8)


@triton.jit
def e2m1_index(a, s8):
    """The E2M1 magnitude index (int32, 0..7) of ``fl(a / s8)`` for ``a ≥ 0`` (tests)."""
    return e2m1_code(a, s8, 1) & 7


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _quantize_tile(v, real, FP4: tl.constexpr, GPU_MATH: tl.constexpr, PTX: tl.constexpr, TREE: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr):
    """One ``BM × BN`` tile of ``v = x / smooth`` (float32): ``(words [BM, BN/8] int32,
    scale bits [BM, BN/BLOCK] int32)``."""
    BLOCK: tl.constexpr = 16 if FP4 else 64
    NB: tl.constexpr = BN // BLOCK
    vb = tl.reshape(v, (BM, NB, BLOCK))
    vbits = vb.to(tl.int32, bitcast=True)
    if GPU_MATH:
        amax = tl.reduce(tl.abs(vb), 2, _max_nan)
    else:  # for |v| the bit patterns order as the values, NaN above Inf
        amax = tl.max(vbits & 0x7FFFFFFF, axis=2).to(tl.float32, bitcast=True)
    bad = ~(amax <= 3.4028234663852886e38)  # the block holds a NaN or an Inf
    if FP4:
        if PTX:  # the GPU's fp8 conversion, and amax / 6 without a division
            s = tl.minimum(div6_rn(amax), 448.0)
            sbits = tl.maximum(s.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32), 1)
            s8 = sbits.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:  # exact integers: the interpreter's fp8 cast is wrong, and no fp8 hardware is needed
            s = tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32))
            sbits = tl.maximum(e4m3_scale_bits(tl.minimum(s, 448.0)), 1)  # a zero scale → 2⁻⁹
            s8 = e4m3_value(sbits)
        s8 = tl.where(bad, float("nan"), s8)[:, :, None]
        code = e2m1_code(vb, s8, TREE)
        # Padding rows are zero bytes: their v is ±0 (0 · a negative rsmooth is -0), so
        # the sign bits are dropped per block there, as for a non-finite block.
        keep = tl.where(bad | ~real[:, None], 0x77777777, -1)
        sbits = tl.where(bad, 0x7F, sbits)
    else:
        # r = 7 / amax; an all-zero block (r = inf) and one too small for r to be
        # finite get codes 0; 0 is never a divisor and inf never a factor
        nonzero = amax > 0
        r = tl.math.div_rn(tl.full(amax.shape, 7.0, tl.float32), tl.where(nonzero, amax, 1.0))
        dropped = bad | ~nonzero | (r == float("inf"))
        scale = div7_rn(amax) if PTX else tl.math.div_rn(amax, tl.full(amax.shape, 7.0, tl.float32))
        scale = tl.maximum(scale, 1e-10)
        y = vb * tl.where(dropped, 0.0, r)[:, :, None]
        code = (y + ROUND_MAGIC).to(tl.int32, bitcast=True) & 0xF
        keep = tl.where(dropped, 0, -1)
        sbits = scale.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
        sbits = tl.where(bad, 0x7E00, sbits)
    sbits = tl.where(real[:, None], sbits, 0)
    # eight codes per 32-bit word, element 8j+k in bits 4k..4k+3 (two per byte, low
    # first): three rounds of pairing neighbours, shifts and ors on whole registers
    lo, hi = tl.split(tl.reshape(code, (BM, BN // 2, 2)))
    lo, hi = tl.split(tl.reshape(lo | (hi << 4), (BM, BN // 4, 2)))
    lo, hi = tl.split(tl.reshape(lo | (hi << 8), (BM, BN // 8, 2)))
    words = tl.reshape(lo | (hi << 16), (BM, NB, BLOCK // 8)) & keep[:, :, None]
    return tl.reshape(words, (BM, BN // 8)), sbits


@triton.jit
def _load_rs(rs_ptr, c, N: tl.constexpr, HAS_SMOOTH: tl.constexpr, BN: tl.constexpr):
    """``1/smooth`` of step column chunk ``c`` (float32 ``[BN]``; 1.0 past N). Without
    smooth, a constant the caller never multiplies by."""
    offs_n = tl.arange(0, BN)
    if HAS_SMOOTH:
        if N % BN != 0:
            return tl.load(rs_ptr + c * BN + offs_n, mask=c * BN + offs_n < N, other=1.0)
        return tl.load(rs_ptr + c * BN + offs_n)
    return tl.full((BN,), 1.0, tl.float32)


@triton.jit
def _step(acc, c, x_ptrs, w_ptrs, rs, q_ptrs, s_ptrs, real, M_PAD,
          N: tl.constexpr, R: tl.constexpr, FP4: tl.constexpr, HAS_SMOOTH: tl.constexpr,
          GPU_MATH: tl.constexpr, PTX: tl.constexpr, TREE: tl.constexpr,
          BM: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr):
    """One step: the ``BM × BN`` tile of x at step ``c`` of its row tile, added to the
    LoRA accumulator (returned) and quantized (codes and scales stored); ``rs`` is the
    step's ``1/smooth`` (:func:`_load_rs`)."""
    BLOCK: tl.constexpr = 16 if FP4 else 64
    NB: tl.constexpr = BN // BLOCK
    MASK_N: tl.constexpr = N % BN != 0
    offs_n = tl.arange(0, BN)
    offs_r = tl.arange(0, BR)
    if MASK_N:
        cols = c * BN + offs_n
        x = tl.load(x_ptrs, mask=real[:, None] & (cols < N)[None, :], other=0.0)
    else:
        x = tl.load(x_ptrs, mask=real[:, None], other=0.0)
    if R > 0:
        if MASK_N:
            w = tl.load(w_ptrs, mask=(offs_r < R)[None, :] & (cols < N)[:, None], other=0.0)
        else:
            w = tl.load(w_ptrs, mask=(offs_r < R)[None, :], other=0.0)
        if GPU_MATH:
            acc = tl.dot(x, w, acc)
        else:
            acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
    v = x.to(tl.float32)
    if HAS_SMOOTH:
        v = v * rs[None, :]
    words, sbits = _quantize_tile(v, real, FP4, GPU_MATH, PTX, TREE, BM, BN)
    if MASK_N:
        tl.store(q_ptrs, words, mask=(c * (BN // 8) + tl.arange(0, BN // 8) < N // 8)[None, :])
        tl.store(s_ptrs, sbits.to(s_ptrs.dtype.element_ty), mask=(c * NB + tl.arange(0, NB) < N // BLOCK)[None, :])
    else:
        tl.store(q_ptrs, words)
        tl.store(s_ptrs, sbits.to(s_ptrs.dtype.element_ty))
    return acc


@triton.jit
def _next_chunk(c, CHUNKS: tl.constexpr):
    """The column chunk of the step after one at chunk ``c`` (the next row tile starts at 0)."""
    return tl.where(c + 1 == CHUNKS, 0, c + 1)


@triton.jit
def _flush(acc, t, c_lo, c_hi, pid, progs, steps, rows, l_ptr, part_ptr, cnt_ptr, MAXC,
           R: tl.constexpr, CHUNKS: tl.constexpr, BM: tl.constexpr, BR: tl.constexpr, RED: tl.constexpr,
           SLOTS: tl.constexpr, NT: tl.constexpr):
    """Row tile ``t``'s LoRA accumulator over its steps ``[c_lo, c_hi)``: written out if
    they are all of the tile's steps, else handed to the tile's reduction (module docstring).

    The program that draws the last ticket sums the slots in slot order. ``RED`` slots are
    loaded per round trip (independent loads, then added in order: the same sums as one at a
    time, since the unused ones are −0.0 and ``a + (−0.0) == a`` for every float32 ``a``).
    ``SLOTS`` > 0 (the launch's slot count, a constant): all of them in one unrolled pass,
    no loop, and ``NT`` > 0 (the program's thread count): a ticket per thread instead of a
    CTA barrier — the flat walk's loop must hold neither a loop nor an explicit barrier to
    be software-pipelined (Triton leaves such loops unpipelined)."""
    offs_m = tl.arange(0, BM)
    offs_r = tl.arange(0, BR)
    out_mask = (offs_r < R)[None, :]
    if (c_lo == 0) & (c_hi == CHUNKS):  # the whole row tile was this program's
        tl.store(l_ptr + rows[:, None] * R + offs_r[None, :], acc, mask=out_mask)
    else:
        # the programs holding the tile's first and last steps (see the docstring)
        first = ((t * CHUNKS + 1) * progs + steps - 1) // steps - 1
        last = ((t + 1) * CHUNKS * progs + steps - 1) // steps - 1
        slots = part_ptr + (t * MAXC * BM + offs_m[:, None]) * R + offs_r[None, :]
        tl.store(slots + (pid - first) * BM * R, acc, mask=out_mask)
        if NT > 0:
            # A ticket per thread (one element each of an [NT] tensor): each thread's
            # release orders its own partial stores, so no CTA barrier is needed before;
            # the program holding the tile's last ticket is last, and the max across the
            # program (through shared memory, after its acquire) tells every thread.
            drawn = tl.atomic_add(cnt_ptr + t + tl.zeros((NT,), tl.int64), 1, sem="acq_rel", scope="gpu")
            is_last = tl.max(drawn, axis=0) == (last - first + 1) * NT - 1
        else:
            tl.debug_barrier()  # every thread's partial is written before the ticket
            is_last = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu") == last - first
        if is_last:
            if NT == 0:
                tl.debug_barrier()
            total = tl.full((BM, BR), -0.0, tl.float32)
            if SLOTS > 0:
                for g in tl.static_range(SLOTS):  # in slot order, whoever came last
                    total += tl.load(slots + g * BM * R, mask=out_mask & (first + g <= last), other=-0.0,
                                     cache_modifier=".cg")
            else:
                j = first
                while j <= last:  # in slot order, whoever came last
                    for g in tl.static_range(RED):
                        total += tl.load(slots + (j + g - first) * BM * R, mask=out_mask & (j + g <= last),
                                         other=-0.0, cache_modifier=".cg")
                    j += RED
            tl.store(l_ptr + rows[:, None] * R + offs_r[None, :], total, mask=out_mask)
            tl.atomic_xchg(cnt_ptr + t, 0, sem="relaxed", scope="gpu")


@triton.jit
def _flat_step(s, acc, rs, start, end, pid, progs, steps, x_ptr, stride_xm, rs_ptr, w_ptr, q_ptr, s_ptr, l_ptr,
               part_ptr, cnt_ptr, M, M_PAD, MAXC,
               N: tl.constexpr, R: tl.constexpr, FP4: tl.constexpr, HAS_SMOOTH: tl.constexpr,
               GPU_MATH: tl.constexpr, PTX: tl.constexpr, TREE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               BR: tl.constexpr, PREFETCH: tl.constexpr, RED: tl.constexpr, SLOTS: tl.constexpr,
               NT: tl.constexpr):
    """Step ``s`` of the flat walk (``FLAT``): its pointers from ``s`` alone, the step, and
    the row tile's LoRA flushed after its last step here. Returns the accumulator (zeroed
    after a flush) and, with ``PREFETCH``, the next step's ``1/smooth``."""
    BLOCK: tl.constexpr = 16 if FP4 else 64
    NB: tl.constexpr = BN // BLOCK
    CHUNKS: tl.constexpr = (N + BN - 1) // BN
    offs_m = tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_r = tl.arange(0, BR)
    t = s // CHUNKS
    c = s - t * CHUNKS
    rows = t * BM + offs_m
    real = rows < M
    x_ptrs = x_ptr + rows[:, None] * stride_xm + (c * BN + offs_n)[None, :]
    w_ptrs = w_ptr + (c * BN + offs_n)[:, None] * R + offs_r[None, :]
    q_ptrs = q_ptr + rows[:, None] * (N // 8) + (c * (BN // 8) + tl.arange(0, BN // 8))[None, :]
    s_ptrs = s_ptr + (c * NB + tl.arange(0, NB))[None, :] * M_PAD + rows[:, None]
    if PREFETCH:
        here = rs
        rs = _load_rs(rs_ptr, _next_chunk(c, CHUNKS), N, HAS_SMOOTH, BN)
    else:
        here = _load_rs(rs_ptr, c, N, HAS_SMOOTH, BN)
    acc = _step(acc, c, x_ptrs, w_ptrs, here, q_ptrs, s_ptrs, real, M_PAD, N, R, FP4, HAS_SMOOTH, GPU_MATH, PTX,
                TREE, BM, BN, BR)
    if R > 0:  # noqa: SIM102 — a compile-time branch around a run-time one
        if (c == CHUNKS - 1) | (s == end - 1):
            _flush(acc, t, tl.maximum(start - t * CHUNKS, 0), c + 1, pid, progs, steps, rows, l_ptr, part_ptr,
                   cnt_ptr, MAXC, R, CHUNKS, BM, BR, RED, SLOTS, NT)
            acc = tl.zeros((BM, BR), dtype=tl.float32)
    return acc, rs


@triton.jit(do_not_specialize=["q_ptr"])
def act_quant_lora_kernel(
    x_ptr, stride_xm,
    rs_ptr,
    w_ptr,
    q_ptr,
    s_ptr,
    l_ptr,
    part_ptr,
    cnt_ptr,
    M, M_PAD, MAXC,
    N: tl.constexpr, R: tl.constexpr,
    FP4: tl.constexpr, HAS_SMOOTH: tl.constexpr, INTERPRETED: tl.constexpr, GPU_MATH: tl.constexpr,
    PTX: tl.constexpr, TREE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr,
    FLAT: tl.constexpr = False, PREFETCH: tl.constexpr = False, RED: tl.constexpr = 1, SLOTS: tl.constexpr = 0,
    NT: tl.constexpr = 0,
):
    BLOCK: tl.constexpr = 16 if FP4 else 64
    NB: tl.constexpr = BN // BLOCK
    CHUNKS: tl.constexpr = (N + BN - 1) // BN
    HAS_LORA: tl.constexpr = R > 0
    # The outputs come in the format's dtypes (uint8 code pairs; fp8 e4m3 or fp16 scales):
    # the kernel writes the codes as 32-bit words and the scales as their bits. Cast here, a
    # view on the host would cost every call a tensor.
    q_ptr = q_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    s_ptr = s_ptr.to(tl.pointer_type(tl.uint8 if FP4 else tl.int16), bitcast=True)
    pid = tl.program_id(0).to(tl.int64)
    progs = tl.num_programs(0).to(tl.int64)
    steps = (M_PAD // BM).to(tl.int64) * CHUNKS
    start = pid * steps // progs
    end = (pid + 1) * steps // progs
    offs_m = tl.arange(0, BM)
    offs_n = tl.arange(0, BN)
    offs_w = tl.arange(0, BN // 8)
    offs_b = tl.arange(0, NB)
    offs_r = tl.arange(0, BR)
    if FLAT:
        # One loop over this program's steps, row tiles included: the software pipeline
        # keeps the next tiles' loads in flight across a row tile's end and its LoRA flush.
        acc = tl.zeros((BM, BR), dtype=tl.float32)
        rs = _load_rs(rs_ptr, start % CHUNKS, N, HAS_SMOOTH, BN)
        if INTERPRETED:  # its range() cannot take bounds computed from program_id
            s = start
            while s < end:
                acc, rs = _flat_step(s, acc, rs, start, end, pid, progs, steps, x_ptr, stride_xm, rs_ptr, w_ptr, q_ptr,
                                     s_ptr, l_ptr, part_ptr, cnt_ptr, M, M_PAD, MAXC, N, R, FP4, HAS_SMOOTH, GPU_MATH,
                                     PTX, TREE, BM, BN, BR, PREFETCH, RED, SLOTS, NT)
                s += 1
        else:
            for s in range(start, end):
                acc, rs = _flat_step(s, acc, rs, start, end, pid, progs, steps, x_ptr, stride_xm, rs_ptr, w_ptr, q_ptr,
                                     s_ptr, l_ptr, part_ptr, cnt_ptr, M, M_PAD, MAXC, N, R, FP4, HAS_SMOOTH, GPU_MATH,
                                     PTX, TREE, BM, BN, BR, PREFETCH, RED, SLOTS, NT)
    else:
        t = start // CHUNKS
        while t * CHUNKS < end:  # the row tiles this program has steps in
            c_lo = tl.maximum(start - t * CHUNKS, 0)
            c_hi = tl.minimum(end - t * CHUNKS, CHUNKS)
            rows = t * BM + offs_m
            real = rows < M
            acc = tl.zeros((BM, BR), dtype=tl.float32)
            # pointers at the first step, advanced by one step per iteration
            x_ptrs = x_ptr + rows[:, None] * stride_xm + (c_lo * BN + offs_n)[None, :]
            w_ptrs = w_ptr + (c_lo * BN + offs_n)[:, None] * R + offs_r[None, :]
            q_ptrs = q_ptr + rows[:, None] * (N // 8) + (c_lo * (BN // 8) + offs_w)[None, :]
            s_ptrs = s_ptr + (c_lo * NB + offs_b)[None, :] * M_PAD + rows[:, None]
            if PREFETCH:
                rs = _load_rs(rs_ptr, c_lo, N, HAS_SMOOTH, BN)
            if INTERPRETED:  # its range() cannot take bounds computed from program_id
                c = c_lo
                while c < c_hi:
                    if PREFETCH:  # the next step's 1/smooth, loaded a step ahead of its use
                        here = rs
                        rs = _load_rs(rs_ptr, _next_chunk(c, CHUNKS), N, HAS_SMOOTH, BN)
                    else:
                        here = _load_rs(rs_ptr, c, N, HAS_SMOOTH, BN)
                    acc = _step(acc, c, x_ptrs, w_ptrs, here, q_ptrs, s_ptrs, real, M_PAD, N, R, FP4, HAS_SMOOTH,
                                GPU_MATH, PTX, TREE, BM, BN, BR)
                    x_ptrs += BN
                    w_ptrs += BN * R
                    q_ptrs += BN // 8
                    s_ptrs += NB * M_PAD
                    c += 1
            else:
                for c in range(c_lo, c_hi):
                    if PREFETCH:
                        here = rs
                        rs = _load_rs(rs_ptr, _next_chunk(c, CHUNKS), N, HAS_SMOOTH, BN)
                    else:
                        here = _load_rs(rs_ptr, c, N, HAS_SMOOTH, BN)
                    acc = _step(acc, c, x_ptrs, w_ptrs, here, q_ptrs, s_ptrs, real, M_PAD, N, R, FP4, HAS_SMOOTH,
                                GPU_MATH, PTX, TREE, BM, BN, BR)
                    x_ptrs += BN
                    w_ptrs += BN * R
                    q_ptrs += BN // 8
                    s_ptrs += NB * M_PAD
            if HAS_LORA:
                _flush(acc, t, c_lo, c_hi, pid, progs, steps, rows, l_ptr, part_ptr, cnt_ptr, MAXC, R, CHUNKS, BM, BR,
                       RED, 0, 0)
            t += 1
