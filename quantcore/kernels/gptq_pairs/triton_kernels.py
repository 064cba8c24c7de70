"""The ``triton_int4`` kernels: one Triton source, three launches, over the words of
``layout.py`` (blocks of 16 words per output row; slice ``i`` of a block is 32 inputs
whose codes sit as pairs in fields ``i`` and ``i + PAIRS``, 16 bits apart).

**Word order** (``FRAGMENTS``, the GEMV and the tensor-core kernel). False: each row's
blocks one contiguous run (``backends/triton_int4/layout.py``), scales and zero points
``[groups, N]``. True: ``hopper_wgmma``'s fragment order (``backends/hopper_wgmma/
layout.py``), whose small-M calls run these kernels on the words its wgmma kernel reads:
blocks 1024 words apart per 64-row tile, the 16 words of one row's block still one
64-byte run but holding pair ``c = u + 4j`` at word ``4u + j``, and scales and zero
points ``[sub-groups, N padded to 64]`` (the scale row is the sub-group: no group map).
The kernels load the words in stored order and read x at the inputs those words hold,
so every weight load stays one 16-byte vector and nothing is permuted in registers.

``gemv_kernel`` (one row of x, CUDA cores). One program per (row of x, ``BLOCK_N``
outputs, K split), walking ``BLOCK_B`` blocks per step as 16-byte vectors of words. A
code becomes a float with **one LOP3 and no conversion**: shifted so its b bits sit at
mantissa bit ``P`` and OR-ed with the exponent of 1.0, the word reads as
``1 + q·2^(P−23)``. ``P`` is 15 or 19 (one shift serves two 4-bit fields), so the FMA
against ``x`` accumulates ``Σ x + Σ q·x·2^(P−23)``; the ``Σ x`` the 1.0 adds is the
same for every output row and is taken out once per group, with the zero point:
``Σ (q − z)·x = Σ_P 2^(23−P)·(Σ f·x − Σ x) − z·Σ x``. Per code: half a shift, one
LOP3, one FFMA. The cancellation costs about ``2^(23−P)·ε₃₂·√n`` relative, ~1e-5.

``mma_kernel`` (tensor cores). The weight is the left operand, ``acc[N, M] += Ŵ·xᵀ``,
so M needs no padding to the MMA's 64-row side, and the dequantized tile goes from
registers into the dot (HGMMA with A in registers on Hopper). ``OPERAND`` picks how
a slice of codes becomes that operand:

* 1 — exact integers: one masked OR turns a word into the pair ``(B + q₀, B + q₁)``
  of halves (``0x4300`` is bf16 128, ``0x6400`` fp16 1024), one packed FMA subtracts
  ``B + z`` exactly, and the group's scale multiplies the fp32 accumulator when the
  group closes (one FMA per accumulator element per group).
* 2 — scaled: ``(q − z)·s`` in fp32, rounded to the activation dtype; one accumulator
  chain across groups (what tinygemm does). More work per code, none per group.
* 0 — the interpreter's: fp32 operands, an IEEE fp32 dot (its bf16 ``tl.dot`` is
  wrong, docs/triton-interpreter.md). The codes and zero points are the same exact
  integers as in mode 1, so the two differ only in the accumulation.

``ASM`` (compiled only; the interpreter cannot run PTX) does the masked OR and the
packed subtraction in inline PTX on whole words of the int16 view (``_PAIR_ASM``):
Triton alone emits a shift, an AND, an OR and a PRMT per code, and stages the
operand through shared memory; with the PTX it is 1.4 instructions per code and the
words go from shared memory to the MMA by ldmatrix (backends/triton_int4/README.md has
the SASS counts).

``dequant_kernel`` writes ``(q − z)·s`` into a scratch for cuBLAS (large M).

Both GEMM-like kernels split K over ``SPLIT_K`` programs when the output alone cannot
fill the GPU. The split is deterministic: each program stores its fp32 partial, and the
last of a tile's programs to arrive (an acq_rel counter per tile, reset by that
program) sums the partials in split order and writes the output: no zeroed buffer, no
second launch. Every loop bound is a compile-time constant (``STEPS``): a layer's K
never changes, and Triton 3.6's interpreter cannot ``range`` over a runtime scalar.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantcore.kernels.gptq_pairs.ptx import pair_asm_text
from quantcore.triton.interpreter import serialize_launches

serialize_launches()  # the interpreter's launches share module state: one at a time

__all__ = ["dequant_kernel", "gemv_kernel", "launch_grid", "mma_kernel"]

#: The bits of 1.0 in fp32: OR-ed with a code at mantissa bit P it reads 1 + q·2^(P−23).
ONE_F32 = tl.constexpr(0x3F800000)
#: The bits of 2^23 in fp32: OR-ed with a code at bit 0 it reads 2^23 + q (exact).
TWO23_F32 = tl.constexpr(0x4B000000)


@triton.jit
def _round_to(acc, dtype: tl.constexpr):
    """fp32 → ``dtype``, round to nearest even. For bf16 on the bits: the interpreter's
    own conversion truncates; the explicit form is exact on the GPU too. NaN keeps its
    own conversion (its rounding carry would run into the sign bit)."""
    if dtype == tl.bfloat16:
        bits = acc.to(tl.uint32, bitcast=True)
        rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000).to(tl.float32, bitcast=True)
        acc = tl.where(acc != acc, acc, rounded)
    return acc.to(dtype)


@triton.jit
def _group_of(k, map_ptr, NUM_GROUPS, NUM_SUB, SG: tl.constexpr, HAS_MAP: tl.constexpr):
    """The group (row of scales) of sorted input ``k`` (scalar or tensor)."""
    sub = k // SG
    if HAS_MAP:
        return tl.load(map_ptr + tl.minimum(sub, NUM_SUB - 1))
    return tl.minimum(sub, NUM_GROUPS - 1)


@triton.jit
def _row_words(offs_n, BLOCKS: tl.constexpr, FRAGMENTS: tl.constexpr):
    """The word where block 0 of output row ``offs_n`` starts (int64; module docstring:
    row ``64·tile + 16w + 8h + g`` of the fragment order at ``1024·tile·blocks + 512h +
    128w + 16g``)."""
    n = offs_n.to(tl.int64)
    if FRAGMENTS:
        r = n % 64
        return (n // 64) * (BLOCKS * 1024) + ((r // 8) % 2) * 512 + (r // 16) * 128 + (r % 8) * 16
    return n * (BLOCKS * 16)


@triton.jit
def _pair_at(q, FRAGMENTS: tl.constexpr):
    """The pair ``c`` (inputs ``2c``, ``2c + 1`` of each slice) that stored word ``q`` of a
    row's block holds: ``c = u + 4j`` at ``q = 4u + j`` in the fragment order."""
    if FRAGMENTS:
        return q // 4 + 4 * (q % 4)
    return q


@triton.jit
def _scale_stride(N, FRAGMENTS: tl.constexpr):
    """Elements per row of scales and zero points: N, or N padded to a 64-row tile."""
    if FRAGMENTS:
        return tl.cdiv(N, 64) * 64
    return N


@triton.jit
def _finish(acc, offs_m, offs_n, m_mask, n_mask, y_ptr, stride_ym, b_ptr, ws_ptr, cnt_ptr,
            tile, pid_k, M, N, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    """Store ``acc`` [BLOCK_M, BLOCK_N] (fp32) as y[offs_m, offs_n] (+ bias), or, split
    over K, hand it to the tile's last program (module docstring)."""
    mask = m_mask[:, None] & n_mask[None, :]
    out_ty: tl.constexpr = y_ptr.dtype.element_ty
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        y_offs = offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptr + y_offs, _round_to(acc, out_ty), mask=mask)
    else:
        ws_offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k.to(tl.int64) * M * N + ws_offs, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is stored before the release below
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros_like(acc)
            for s in tl.static_range(SPLIT_K):
                # .cg: from L2, where the other programs' partials are (L1 is not coherent).
                total += tl.load(ws_ptr + s * M * N + ws_offs, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            y_offs = offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :]
            tl.store(y_ptr + y_offs, _round_to(total, out_ty), mask=mask)
            tl.atomic_xchg(cnt_ptr + tile, 0)  # ready for the next launch


# --- GEMV -------------------------------------------------------------------------------


@triton.jit
def _mantissa_code(w, F: tl.constexpr, BITS: tl.constexpr, P: tl.constexpr, ASM: tl.constexpr):
    """Field ``F`` of the words ``w`` as the fp32 ``1 + q·2^(P−23)``: a shift (the same
    for the two fields that land on P = 15 and 19, so computed once) and a masked OR."""
    SH: tl.constexpr = BITS * F - P
    if SH > 0:
        v = w >> SH
    elif SH < 0:
        v = w << (-SH)
    else:
        v = w
    if ASM:
        if BITS == 8:
            return tl.inline_asm_elementwise("lop3.b32 $0, $1, 0x7F8000, 0x3F800000, 0xea;", "=r,r", [v],
                                             dtype=tl.float32, is_pure=True, pack=1)
        elif P == 15:
            return tl.inline_asm_elementwise("lop3.b32 $0, $1, 0x78000, 0x3F800000, 0xea;", "=r,r", [v],
                                             dtype=tl.float32, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise("lop3.b32 $0, $1, 0x780000, 0x3F800000, 0xea;", "=r,r", [v],
                                             dtype=tl.float32, is_pure=True, pack=1)
    return ((v & (((1 << BITS) - 1) << P)) | ONE_F32).to(tl.float32, bitcast=True)


@triton.jit
def gemv_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, map_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_ym, NUM_GROUPS, NUM_SUB,
    BITS: tl.constexpr, SG: tl.constexpr, CLOSE: tl.constexpr, BLOCKS: tl.constexpr,
    HAS_ZEROS: tl.constexpr, HAS_MAP: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, ASM: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT_K: tl.constexpr, STEPS: tl.constexpr,
    FRAGMENTS: tl.constexpr,
):
    PAIRS: tl.constexpr = 16 // BITS
    BK: tl.constexpr = 32 * PAIRS
    HALF_Z: tl.constexpr = 8.0 if BITS == 4 else 128.0  # the zero point of symmetric codes
    EXACT: tl.constexpr = BLOCK_B * STEPS * SPLIT_K == BLOCKS  # no program walks past the last block
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    BSTRIDE: tl.constexpr = 1024 if FRAGMENTS else 16  # words from one block of a row to the next
    S_STRIDE = _scale_stride(N, FRAGMENTS)
    offs_b = tl.arange(0, BLOCK_B)
    offs_q = tl.arange(0, 16)
    offs_c = _pair_at(offs_q, FRAGMENTS)
    w_base = (w_ptr + _row_words(offs_n, BLOCKS, FRAGMENTS)[:, None, None]
              + offs_b[None, :, None] * BSTRIDE + offs_q[None, None, :])
    # x of field f of word c: input (f mod PAIRS)·32 + 2c + f div PAIRS of the block.
    x_base = x_ptr + row.to(tl.int64) * stride_xm + (offs_b[None, :, None] * BK + 2 * offs_c[None, None, :])
    acc = tl.zeros([BLOCK_N, BLOCK_B], dtype=tl.float32)
    for step in range(STEPS):
        blk0 = (pid_k * STEPS + step) * BLOCK_B
        blk = blk0 + offs_b
        if EVEN_N and EXACT:
            w = tl.load(w_base + blk0 * BSTRIDE, eviction_policy="evict_first")
        else:
            w = tl.load(w_base + blk0 * BSTRIDE, mask=n_mask[:, None, None] & (blk < BLOCKS)[None, :, None], other=0,
                        eviction_policy="evict_first")
        p15 = tl.zeros([BLOCK_N, BLOCK_B, 16], dtype=tl.float32)  # Σ f·x of fields at bit 15
        p19 = tl.zeros([BLOCK_N, BLOCK_B, 16], dtype=tl.float32)  # ... and at bit 19 (4-bit)
        x15 = tl.zeros([1, BLOCK_B, 16], dtype=tl.float32)
        x19 = tl.zeros([1, BLOCK_B, 16], dtype=tl.float32)
        for i in tl.static_range(PAIRS):
            for h in tl.static_range(2):
                x_ptrs = x_base + blk0 * BK + i * 32 + h
                if EVEN_K and EXACT:
                    xf = tl.load(x_ptrs).to(tl.float32)
                else:
                    k_here = blk[None, :, None] * BK + i * 32 + 2 * offs_c[None, None, :] + h
                    xf = tl.load(x_ptrs, mask=k_here < K, other=0.0).to(tl.float32)
                if BITS == 8 or (i + h * PAIRS) % 2 == 0:  # field i + h·PAIRS
                    p15 += _mantissa_code(w, i + h * PAIRS, BITS, 15, ASM) * xf
                    x15 += xf
                else:
                    p19 += _mantissa_code(w, i + h * PAIRS, BITS, 19, ASM) * xf
                    x19 += xf
            if (i + 1) % CLOSE == 0:
                g = _group_of(blk * BK + (i + 1 - CLOSE) * 32, map_ptr, NUM_GROUPS, NUM_SUB, SG, HAS_MAP)
                g_offs = g[None, :].to(tl.int64) * S_STRIDE + offs_n[:, None]
                g_mask = n_mask[:, None] & (blk < BLOCKS)[None, :]
                s = tl.load(s_ptr + g_offs, mask=g_mask, other=0.0).to(tl.float32)
                sum15 = tl.sum(x15, axis=2)
                t = 256.0 * (tl.sum(p15, axis=2) - sum15)
                sum_x = sum15
                if BITS == 4:
                    sum19 = tl.sum(x19, axis=2)
                    t += 16.0 * (tl.sum(p19, axis=2) - sum19)
                    sum_x += sum19
                if HAS_ZEROS:
                    t -= tl.load(z_ptr + g_offs, mask=g_mask, other=0).to(tl.float32) * sum_x
                else:
                    t -= HALF_Z * sum_x
                acc += s * t
                p15 = tl.zeros([BLOCK_N, BLOCK_B, 16], dtype=tl.float32)
                p19 = tl.zeros([BLOCK_N, BLOCK_B, 16], dtype=tl.float32)
                x15 = tl.zeros([1, BLOCK_B, 16], dtype=tl.float32)
                x19 = tl.zeros([1, BLOCK_B, 16], dtype=tl.float32)
    y = tl.sum(acc, axis=1)[None, :]
    tile = row * tl.cdiv(N, BLOCK_N) + pid_n
    offs_m = row + tl.arange(0, 1)
    _finish(y, offs_m, offs_n, offs_m < M, n_mask, y_ptr, stride_ym, b_ptr, ws_ptr, cnt_ptr,
            tile, pid_k, M, N, HAS_BIAS, SPLIT_K)


# --- tensor-core GEMM -----------------------------------------------------------------------


def _asm_index(bits: int, fp16: bool, scaled: bool, zero: bool, i: int) -> int:
    return (((bits == 8) * 2 + fp16) * 2 + scaled) * 8 + zero * 4 + i


#: Every variant of :func:`~quantcore.kernels.gptq_pairs.ptx.pair_asm_text`, at :func:`_asm_index`
#: (slice i shifts by bits·i; 8-bit has 2 slices).
_PAIR_ASM = tl.constexpr(tuple(
    pair_asm_text(bits, fp16, bits * i, zero, scaled) if i < 16 // bits else ""
    for bits in (4, 8) for fp16 in (False, True) for scaled in (False, True) for zero in (False, True)
    for i in range(4)
))


@triton.jit
def _asm_pair(w16, zin, sin, IDX: tl.constexpr, ZR: tl.constexpr, SR: tl.constexpr, act: tl.constexpr):
    """``_PAIR_ASM[IDX]`` on ``w16``, with ``ZR`` zero-point and ``SR`` scale registers."""
    if act == tl.float16:
        out = _asm_call(w16, zin, sin, IDX, ZR, SR, tl.float16)
    else:
        out = _asm_call(w16, zin, sin, IDX, ZR, SR, tl.bfloat16)
    return out


@triton.jit
def _asm_call(w16, zin, sin, IDX: tl.constexpr, ZR: tl.constexpr, SR: tl.constexpr, DT: tl.constexpr):
    # One branch per operand list; inline_asm_elementwise wants the dtype object itself.
    if ZR == 0 and SR == 0:
        out = tl.inline_asm_elementwise(_PAIR_ASM[IDX], "=r,r", [w16], dtype=DT.value, is_pure=True, pack=2)
    elif SR == 0:
        out = tl.inline_asm_elementwise(_PAIR_ASM[IDX], "=r,r,r" if ZR == 1 else "=r,r,r,r", [w16, zin],
                                        dtype=DT.value, is_pure=True, pack=2)
    elif ZR == 0:
        out = tl.inline_asm_elementwise(_PAIR_ASM[IDX], "=r,r,r" if SR == 1 else "=r,r,r,r", [w16, sin],
                                        dtype=DT.value, is_pure=True, pack=2)
    else:
        out = tl.inline_asm_elementwise(_PAIR_ASM[IDX], "=r,r,r,r" if ZR == 1 else "=r,r,r,r,r,r",
                                        [w16, zin, sin], dtype=DT.value, is_pure=True, pack=2)
    return out


@triton.jit
def _slice_operand(w16, SL: tl.constexpr, BITS: tl.constexpr, z, s, act: tl.constexpr,
                   HAS_ZEROS: tl.constexpr, OPERAND: tl.constexpr, ASM: tl.constexpr, BLOCK_N: tl.constexpr):
    """Slice ``SL`` of a block as the dot's left operand [BLOCK_N, 32]. ``w16`` is the
    block's words viewed as int16 [BLOCK_N, 32]: element e holds input e of every slice
    (slice i in its field i), so the operand is elementwise in ``w16`` and each word
    yields an (input e, e + 1) pair — the register a tensor-core operand wants."""
    if OPERAND != 0 and ASM:
        WIDE: tl.constexpr = BITS == 8 and act == tl.bfloat16  # through fp32 (see pair_asm_text)
        IDX: tl.constexpr = (((BITS == 8) * 2 + (act == tl.float16)) * 2 + (OPERAND == 2)) * 8 + HAS_ZEROS * 4 + SL
        ZR: tl.constexpr = (2 if WIDE else 1) if HAS_ZEROS else 0
        SR: tl.constexpr = (2 if WIDE else 1) if OPERAND == 2 else 0
        if WIDE:
            zin = tl.broadcast_to((8388608.0 + z)[:, None], [BLOCK_N, 32])
            sin = tl.broadcast_to(s[:, None], [BLOCK_N, 32])
        else:
            base: tl.constexpr = 1024.0 if act == tl.float16 else 128.0
            zin = tl.broadcast_to((-(base + z)).to(act).to(tl.int16, bitcast=True)[:, None], [BLOCK_N, 32])
            sin = tl.broadcast_to(s.to(act)[:, None], [BLOCK_N, 32])
        return _asm_pair(w16, zin, sin, IDX, ZR, SR, act)
    q = ((w16 >> (BITS * SL)) & ((1 << BITS) - 1)).to(tl.int32)
    v = (q | TWO23_F32).to(tl.float32, bitcast=True) - (8388608.0 + z)[:, None]  # q − z, exact
    if OPERAND == 2:
        v = v * s[:, None]
    if OPERAND != 0:
        v = v.to(act)
    return v


@triton.jit
def mma_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, map_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_ym, NUM_GROUPS, NUM_SUB,
    BITS: tl.constexpr, SG: tl.constexpr, CLOSE: tl.constexpr, BLOCKS: tl.constexpr,
    HAS_ZEROS: tl.constexpr, HAS_MAP: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, ASM: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_B: tl.constexpr,
    SPLIT_K: tl.constexpr, STEPS: tl.constexpr, OPERAND: tl.constexpr, FRAGMENTS: tl.constexpr,
):
    """``w_ptr`` is the weight viewed as int16 (element ``2q + h``: half h of word q)."""
    PAIRS: tl.constexpr = 16 // BITS
    BK: tl.constexpr = 32 * PAIRS
    HALF_Z: tl.constexpr = 8.0 if BITS == 4 else 128.0
    EXACT: tl.constexpr = BLOCK_B * STEPS * SPLIT_K == BLOCKS  # no program walks past the last block
    act: tl.constexpr = x_ptr.dtype.element_ty
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    # Consecutive programs share a weight tile (pid_n) across M tiles: the weight, the
    # larger operand, is read from DRAM once and served from L2 to the rest.
    num_m = tl.cdiv(M, BLOCK_M)
    pid_n = pid // num_m
    pid_m = pid % num_m
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    BSTRIDE: tl.constexpr = 2048 if FRAGMENTS else 32  # int16s from one block of a row to the next
    S_STRIDE = _scale_stride(N, FRAGMENTS)
    offs_p = tl.arange(0, 32)  # stored position in the row's block
    offs_e = 2 * _pair_at(offs_p // 2, FRAGMENTS) + offs_p % 2  # the input of each slice it holds
    n_mask = offs_n < N
    m_mask = offs_m < M
    w_base = w_ptr + 2 * _row_words(offs_n, BLOCKS, FRAGMENTS)[:, None] + offs_p[None, :]
    x_base = x_ptr + offs_m.to(tl.int64)[None, :] * stride_xm + offs_e[:, None]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for step in range(STEPS):
        for bb in tl.static_range(BLOCK_B):
            blk = (pid_k * STEPS + step) * BLOCK_B + bb
            if EVEN_N and EXACT:
                w16 = tl.load(w_base + blk * BSTRIDE, eviction_policy="evict_first")
            else:
                w16 = tl.load(w_base + blk * BSTRIDE, mask=n_mask[:, None] & (blk < BLOCKS), other=0,
                              eviction_policy="evict_first")
            for i in tl.static_range(PAIRS):
                if i % CLOSE == 0:
                    # The scale and zero point of this run of CLOSE slices (one group).
                    g = _group_of(blk * BK + i * 32, map_ptr, NUM_GROUPS, NUM_SUB, SG, HAS_MAP)
                    s = tl.load(s_ptr + g.to(tl.int64) * S_STRIDE + offs_n, mask=n_mask, other=0.0).to(tl.float32)
                    if HAS_ZEROS:
                        z = tl.load(z_ptr + g.to(tl.int64) * S_STRIDE + offs_n, mask=n_mask, other=0).to(tl.float32)
                    else:
                        z = tl.full([BLOCK_N], HALF_Z, tl.float32)
                    accg = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
                k0 = blk * BK + i * 32
                if EVEN_K and EXACT:
                    xi = tl.load(x_base + k0, mask=m_mask[None, :], other=0.0)
                else:
                    xi = tl.load(x_base + k0, mask=m_mask[None, :] & ((k0 + offs_e) < K)[:, None], other=0.0)
                wi = _slice_operand(w16, i, BITS, z, s, act, HAS_ZEROS, OPERAND, ASM, BLOCK_N)
                if OPERAND == 0:
                    accg = tl.dot(wi, xi.to(tl.float32), accg, input_precision="ieee")
                elif OPERAND == 1:
                    accg = tl.dot(wi, xi, accg)
                else:
                    acc = tl.dot(wi, xi, acc)
                if OPERAND != 2 and (i + 1) % CLOSE == 0:
                    acc += s[:, None] * accg
    _finish(tl.trans(acc), offs_m, offs_n, m_mask, n_mask, y_ptr, stride_ym, b_ptr, ws_ptr, cnt_ptr,
            pid, pid_k, M, N, HAS_BIAS, SPLIT_K)


# --- dequantization into a scratch (large M: then cuBLAS) -------------------------------------


@triton.jit
def dequant_kernel(
    w_ptr, s_ptr, z_ptr, map_ptr, out_ptr, N, K, NUM_GROUPS, NUM_SUB,
    BITS: tl.constexpr, SG: tl.constexpr, BLOCKS: tl.constexpr,
    HAS_ZEROS: tl.constexpr, HAS_MAP: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``out[n, k] = (q − z)·s`` in out's dtype, one block per program (``w_ptr``: the
    int16 view, as for ``mma_kernel``)."""
    PAIRS: tl.constexpr = 16 // BITS
    BK: tl.constexpr = 32 * PAIRS
    HALF_Z: tl.constexpr = 8.0 if BITS == 4 else 128.0
    pid_n = tl.program_id(0)
    blk = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_e = tl.arange(0, 32)
    n_mask = offs_n < N
    w16 = tl.load(w_ptr + offs_n.to(tl.int64)[:, None] * (BLOCKS * 32) + blk * 32 + offs_e[None, :],
                  mask=n_mask[:, None], other=0)
    out_rows = out_ptr + offs_n.to(tl.int64)[:, None] * K
    for i in tl.static_range(PAIRS):
        g = _group_of(blk * BK + i * 32, map_ptr, NUM_GROUPS, NUM_SUB, SG, HAS_MAP)
        s = tl.load(s_ptr + g.to(tl.int64) * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        if HAS_ZEROS:
            z = tl.load(z_ptr + g.to(tl.int64) * N + offs_n, mask=n_mask, other=0).to(tl.float32)
        else:
            z = tl.full([BLOCK_N], HALF_Z, tl.float32)
        v = _slice_operand(w16, i, BITS, z, s, tl.float32, HAS_ZEROS, 2, False, BLOCK_N)
        k = blk * BK + i * 32 + offs_e
        tl.store(out_rows + k[None, :], _round_to(v, out_ptr.dtype.element_ty),
                 mask=n_mask[:, None] & (k < K)[None, :])


def launch_grid(path: str, m: int, n_tiles: int, block_m: int, split: int) -> tuple[tuple[int, int, int], int]:
    """``(grid, output tiles)`` of a ``gemv_kernel`` (``path == "gemv"``: one program per
    row and output tile) or ``mma_kernel`` launch over ``m`` rows, split ``split`` ways
    along K. Integer ceilings written out: ``triton.cdiv`` costs microseconds a call."""
    if path == "gemv":
        return (n_tiles, m, split), n_tiles * m
    tiles = n_tiles * -(-m // block_m)
    return (tiles, split, 1), tiles
