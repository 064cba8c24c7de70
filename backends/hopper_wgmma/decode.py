"""The warp-level decode kernel over ``hopper_wgmma``'s prepared words, for M ≤ 16
(:class:`~.plans.DecodePlan`, ``decode_bucket.py``; measured in the README, "A warp-level
decode kernel"). It has no TMA ring, no mbarrier and no warpgroup-wide wgmma wait:

* each warp owns 16 weight rows of a 64-row tile and reads its fragment of a block
  straight from global memory into registers, two 16-byte loads a thread (the layout
  puts each thread's words together), two steps in flight (ping-pong registers);
* per slice of 32 inputs one LOP3 and one packed FMA a pair of codes give the exact
  integers ``q − z`` in the activation dtype, already in the A-operand registers of
  ``mma.sync.m16n8k16`` (the reshape/permute of the loaded words moves no data);
* x is the B operand, ``[32, 8]`` (or ``[32, 16]``: two MMAs) a slice from shared memory
  (staged once per program): one column per activation row, so M = 1…8 cost the same;
  each group's fp32 product is scaled when the group closes;
* K is cut between programs (``split``; partials summed in slot order by the last one,
  ``quantcore/triton/gluon_split_k.tile_store``) and, for an experiment, between groups of four warps of one
  program (``KW``), whose sums meet in shared memory.

2.3 SASS instructions a code against the wgmma kernel's 4.4. Where it is faster than the
wgmma plans (a large N at K ≥ 4096 on the H200: 5–24 %) a card's own table names it.
``READ_ONLY`` and ``DEPTH`` are a probe's (``tools/probes/hopper_decode.py``): the same
launch with its work taken out step by step, and more steps in flight.
"""

from __future__ import annotations

import collections

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from quantcore.kernels.gptq_pairs.ptx import pair_asm_text
from quantcore.triton.gluon_split_k import tile_store

from .codebook import CODEBOOK_FILL_ASM, lookup_pair_asm_text
from .rotation_programs import arrive_rotated, rotation_program, wait_rotated

__all__ = ["BM", "compile_report", "decode_grid", "decode_kernel", "whole_runs"]

#: Activation rows one launch covers at most (the MMA's N, twice).
BM = 16

#: The unscaled pairs ``(q₀ − z, q₁ − z)`` at ``((bits == 8)·2 + fp16)·8 + zero·4 + slice``.
_EXACT_ASM = gl.constexpr(tuple(
    pair_asm_text(bits, fp16, bits * i, zero, scaled=False) if i < 16 // bits else ""
    for bits in (4, 8) for fp16 in (False, True) for zero in (False, True) for i in range(4)
))


#: The unscaled codebook pairs ``(c[q₀], c[q₁])`` of a ``LOOKUP`` launch, at ``fp16·4 + slice``.
_LOOKUP_ASM = gl.constexpr(tuple(lookup_pair_asm_text(fp16, 4 * i, scaled=False)
                                 for fp16 in (False, True) for i in range(4)))
_FILL_ASM = gl.constexpr(CODEBOOK_FILL_ASM)


@gluon.constexpr_function
def _mma_layout(kw):
    # Warp 4·g + w: rows 16w… of K-group g (row 64·g + r of the stacked operand).
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4 * kw, 1], instr_shape=[16, 8])


@gluon.constexpr_function
def _words_layout(kw):
    # [KW, 8, 256] int16, one block of a 64-row tile per K-group: row 4h + w, column
    # 8·lane + 2j + b (layout.py); warp w of a group reads rows w and 4 + w, 16 contiguous
    # bytes a thread a row.
    return gl.BlockedLayout([1, 1, 8], [1, 1, 32], [kw, 4, 1], [2, 1, 0])


@gluon.constexpr_function
def _stage_layout(pairs, kw):
    return gl.BlockedLayout([1, 1, 8], [1, 8, 4], [pairs, kw, 4 // pairs], [2, 1, 0])


_X_SHARED = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2))


@gluon.jit
def _as_operand(words, KW: gl.constexpr, a_layout: gl.constexpr):
    """The words of a block (one per K-group) as the A operand's registers ``[64·KW, 32]``
    (row 64·g + 16w + 8h + lane/4, input 8j + 2u + b of each slice): a reshape and permute
    that move no data."""
    w7 = gl.reshape(words, [KW, 2, 4, 8, 4, 4, 2])  # (g, h, w, lane/4, u, j, b)
    w7 = gl.permute(w7, [0, 2, 1, 3, 5, 4, 6])  # (g, w, h, lane/4, j, u, b)
    return gl.convert_layout(gl.reshape(w7, [KW * 64, 32]), a_layout, assert_trivial=True)


@gluon.jit
def _stage_x(x_ptr, x_smem, M, K, stride_xm, first, KW: gl.constexpr, STEPS: gl.constexpr,
             PAIRS: gl.constexpr, EVEN_K: gl.constexpr, ROWS: gl.constexpr):
    """x of the program's blocks into shared memory, ``[STEPS·PAIRS, KW·ROWS, 32]``: entry
    ``(PAIRS·b + sl, ROWS·g + m, k)`` is input ``32·(PAIRS·(first + STEPS·g + b) + sl) + k``
    of row m (zero past M and K), so each slice's B operand (every K-group's x side by side)
    is one shared-memory read. The loads do not wait for each other: one trip to L2."""
    layout: gl.constexpr = _stage_layout(PAIRS, KW)
    sl = gl.arange(0, PAIRS, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
    gm = gl.arange(0, KW * ROWS, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    k = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    kk = (gl.expand_dims(gl.expand_dims(sl * 32, 1), 2) + gl.expand_dims(gl.expand_dims(k, 0), 1)
          + gl.expand_dims(gl.expand_dims((gm // ROWS) * (STEPS * 32 * PAIRS), 0), 2))
    mm = gl.expand_dims(gl.expand_dims(gm % ROWS, 0), 2)
    offs = mm.to(gl.int64) * stride_xm + kk
    # The same bytes seen as [STEPS, PAIRS·KW·ROWS, 32]: the 64-byte swizzle repeats every 8
    # rows, so the rows of step b's view are its slices' rows in order.
    view = x_smem._reinterpret(x_smem.dtype, [STEPS, PAIRS * KW * ROWS, 32], x_smem.layout)
    for b in gl.static_range(STEPS):
        k0 = (first + b) * (32 * PAIRS)
        mask = mm < M
        if not EVEN_K:
            mask = mask & (k0 + kk < K)
        x = gl.load(x_ptr + k0 + offs, mask=mask, other=0.0)
        view.index(b).store(gl.reshape(x, [PAIRS * KW * ROWS, 32]))


@gluon.jit
def _group_blocks(g, first, b, blocks, STEPS: gl.constexpr):
    """Block of step ``b`` of K-group ``g`` (a tensor); past the weight's end the last
    block, whose x is zero there."""
    return gl.minimum(first + g * STEPS + b, blocks - 1)


@gluon.jit
def _fetch(w_tile, w_offs, g_w, g_c, r_c, first, b, blocks, s_ptr, NP,
           BITS: gl.constexpr, SG: gl.constexpr, STEPS: gl.constexpr):
    """What step ``b`` reads from global memory: each K-group's block of words and the
    first scale row of each accumulator row's block."""
    BK: gl.constexpr = 512 // BITS
    blk_w = _group_blocks(g_w, first, b, blocks, STEPS)
    blk_c = _group_blocks(g_c, first, b, blocks, STEPS)
    words = gl.load(w_tile + blk_w * 2048 + w_offs, eviction_policy="evict_first")
    return words, gl.load(s_ptr + ((blk_c * BK) // SG) * NP + r_c)


@gluon.jit
def _block(acc, words, s0, b, first, blocks, x_smem, s_ptr, z_ptr, NP, g_a, r_a, g_c, r_c,
           KW: gl.constexpr, STEPS: gl.constexpr, BITS: gl.constexpr, SG: gl.constexpr, CLOSE: gl.constexpr,
           HAS_ZEROS: gl.constexpr, act: gl.constexpr, mma_layout: gl.constexpr, a_layout: gl.constexpr,
           b_layout: gl.constexpr, ROWS: gl.constexpr, LOOKUP: gl.constexpr = False):
    """Step ``b`` from what :func:`_fetch` read: each K-group's block dequantized and
    multiplied by x from shared memory, each group's product scaled into ``acc`` when it
    closes. The MMA multiplies every K-group's rows by every K-group's x; only the
    diagonal is kept (:func:`_diagonal_sum`)."""
    PAIRS: gl.constexpr = 16 // BITS
    BK: gl.constexpr = 32 * PAIRS
    w16 = _as_operand(words, KW, a_layout)
    blk_a = _group_blocks(g_a, first, b, blocks, STEPS)
    blk_c = _group_blocks(g_c, first, b, blocks, STEPS)
    part = gl.zeros([KW * 64, KW * ROWS], gl.float32, mma_layout)
    for sl in gl.static_range(PAIRS):
        if LOOKUP:
            a = gl.inline_asm_elementwise(_LOOKUP_ASM[(act == gl.float16) * 4 + sl], "=r,r", [w16],
                                          dtype=act.value, is_pure=True, pack=2)
        else:
            a = _exact_operand(w16, z_ptr + ((blk_a * BK + sl * 32) // SG) * NP + r_a, sl, BITS, HAS_ZEROS, act)
        xb = x_smem.index(b * PAIRS + sl).permute((1, 0)).load(b_layout)
        part = mma_v2(a, xb, part)
        if (sl + 1) % CLOSE == 0:
            if sl + 1 == CLOSE:
                s = s0.to(gl.float32)
            else:  # groups narrower than the block: the later scale rows
                s = gl.load(s_ptr + ((blk_c * BK + sl * 32) // SG) * NP + r_c).to(gl.float32)
            acc += gl.expand_dims(s, 1) * part
            part = gl.zeros([KW * 64, KW * ROWS], gl.float32, mma_layout)
    return acc


@gluon.jit
def _diagonal_sum(acc, KW: gl.constexpr, mma_layout: gl.constexpr):
    """``[64, 8]``: the sum over K-groups g of ``acc[64·g + r, 8·g + m]``."""
    rg = gl.arange(0, KW * 64, layout=gl.SliceLayout(1, mma_layout)) // 64
    cg = gl.arange(0, KW * 8, layout=gl.SliceLayout(0, mma_layout)) // 8
    diag = gl.where(gl.expand_dims(rg, 1) == gl.expand_dims(cg, 0), acc, 0.0)
    return gl.sum(gl.sum(gl.reshape(diag, [KW, 64, KW, 8]), axis=2), axis=0)


@gluon.jit
def _exact_operand(w16, z_ptrs, SL: gl.constexpr, BITS: gl.constexpr, HAS_ZEROS: gl.constexpr,
                   act: gl.constexpr):
    """Slice ``SL`` of the block: the exact ``q − z`` in the activation dtype, [64, 32]."""
    FP16: gl.constexpr = act == gl.float16
    IDX: gl.constexpr = ((BITS == 8) * 2 + FP16) * 8 + HAS_ZEROS * 4 + SL
    if HAS_ZEROS:
        z = gl.load(z_ptrs).to(gl.float32)
        if BITS == 8 and not FP16:
            # 8-bit codes in bf16 go through fp32: the zero point as 2^23 + z.
            zin = gl.broadcast(gl.expand_dims(8388608.0 + z, 1), w16)[0]
            return gl.inline_asm_elementwise(_EXACT_ASM[IDX], "=r,r,r,r", [w16, zin],
                                             dtype=act.value, is_pure=True, pack=2)
        base: gl.constexpr = 1024.0 if FP16 else 128.0
        zin = gl.broadcast(gl.expand_dims((-(base + z)).to(act), 1), w16)[0]
        return gl.inline_asm_elementwise(_EXACT_ASM[IDX], "=r,r,r", [w16, zin], dtype=act.value, is_pure=True,
                                         pack=2)
    return gl.inline_asm_elementwise(_EXACT_ASM[IDX], "=r,r", [w16], dtype=act.value, is_pure=True, pack=2)


@gluon.jit
def decode_kernel(
    w_ptr, x_ptr, s_ptr, z_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_ym, NP, blocks, split_k, rx_ptr, rot_ptr, sync_ptr, rot_rows,
    BITS: gl.constexpr, SG: gl.constexpr, CLOSE: gl.constexpr, HAS_ZEROS: gl.constexpr, HAS_BIAS: gl.constexpr,
    SPLIT: gl.constexpr, EVEN_K: gl.constexpr, KW: gl.constexpr, STEPS: gl.constexpr,
    READ_ONLY: gl.constexpr = 0, DEPTH: gl.constexpr = 2, ROWS: gl.constexpr = 8, LOOKUP: gl.constexpr = False,
    GATED: gl.constexpr = False, ROTATE: gl.constexpr = False, RD: gl.constexpr = 128, RCOLS: gl.constexpr = 128,
    RSHARED: gl.constexpr = True, RDIRECT: gl.constexpr = False,
):
    """``w_ptr``: the prepared words as int16 (``[tiles, blocks·2048]``); ``x_ptr``: x
    ``[M, K]`` (row stride ``stride_xm``); ``s_ptr``/``z_ptr``: scale and zero-point rows
    per sub-group of ``SG`` inputs ``[subs, NP]``. Grid ``(tiles, split)``: program
    ``(t, p)`` of ``4·KW`` warps takes blocks ``[p·KW·STEPS, (p + 1)·KW·STEPS)`` of tile t,
    ``STEPS`` for each of its ``KW`` K-groups of four warps; the groups' sums meet in
    shared memory, the programs' (``SPLIT``) in the workspace. ``CLOSE``: slices between
    two scale rows. ``READ_ONLY`` (a probe's floor, never a result): 1 the same reads and
    sums without dequantization or MMA, 2 without the sum over programs either, 3 nor the
    staging of x. ``DEPTH``: steps in flight a warp, 2 or 4 (register sets refilled in turn).
    ``ROWS``: activation rows a launch multiplies, 8 or 16 (one or two ``m16n8k16`` a slice;
    16 with one K-group). ``LOOKUP`` (4-bit codes, without ``HAS_ZEROS``): the operand is
    ``c[q]`` of a codebook (``codebook.py``) whose 16 float32 centroids ``z_ptr`` points to,
    each group's product scaled when it closes, as ever. ``GATED`` (``READ_ONLY`` 0; N/2 a
    multiple of 64): ``y`` is ``[M, N/2]``, ``silu(gate) · up`` of the N outputs (gate's then
    up's), through the workspace (``quantcore/triton/gluon_split_k.py``). ``ROTATE``
    (``LOOKUP``, not ``GATED``): a TurboQuant layer's rotation in the same launch
    (``rotation_programs.py``): ``rot_rows`` rows of rotation programs in front along y
    rotate ``rx_ptr`` (the layer's x, ``[M, K·RD/RCOLS]``) by ``rot_ptr`` (``[R, RD,
    RCOLS]``, R = 1 with ``RSHARED``; its transpose with ``RDIRECT``: ``rotate_chunk``) into
    ``x_ptr`` (the workspace the program reads, ``[M, K]``); ``sync_ptr``: their two int32
    counts. Without it those four are unused."""
    tile = gl.program_id(0)
    pid_y = gl.program_id(1)
    if ROTATE:
        gl.static_assert(LOOKUP and not GATED and READ_ONLY == 0, "ROTATE: a codebook weight's whole walk, not gated")
        if pid_y < rot_rows:
            rotation_program(rx_ptr, rot_ptr, x_ptr, sync_ptr, pid_y, M, K, RD, RCOLS, RSHARED, 4 * KW, RDIRECT)
        else:
            _decode_program(w_ptr, x_ptr, s_ptr, z_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_ym,
                            NP, blocks, split_k, sync_ptr, tile, pid_y - rot_rows, BITS, SG, CLOSE, HAS_ZEROS,
                            HAS_BIAS, SPLIT, EVEN_K, KW, STEPS, READ_ONLY, DEPTH, ROWS, LOOKUP, GATED, True, RCOLS)
    else:
        _decode_program(w_ptr, x_ptr, s_ptr, z_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, stride_xm, stride_ym,
                        NP, blocks, split_k, sync_ptr, tile, pid_y, BITS, SG, CLOSE, HAS_ZEROS, HAS_BIAS, SPLIT,
                        EVEN_K, KW, STEPS, READ_ONLY, DEPTH, ROWS, LOOKUP, GATED, False, RCOLS)


@gluon.jit
def _decode_program(
    w_ptr, x_ptr, s_ptr, z_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_ym, NP, blocks, split_k, sync_ptr, tile, pid_k,
    BITS: gl.constexpr, SG: gl.constexpr, CLOSE: gl.constexpr, HAS_ZEROS: gl.constexpr, HAS_BIAS: gl.constexpr,
    SPLIT: gl.constexpr, EVEN_K: gl.constexpr, KW: gl.constexpr, STEPS: gl.constexpr, READ_ONLY: gl.constexpr,
    DEPTH: gl.constexpr, ROWS: gl.constexpr, LOOKUP: gl.constexpr, GATED: gl.constexpr, ROTATED: gl.constexpr,
    RCOLS: gl.constexpr,
):
    """Program ``(tile, pid_k)`` of the code matrix (:func:`decode_kernel`); ``ROTATED``: x
    is the workspace the launch's rotation programs fill, waited for before it is staged."""
    PAIRS: gl.constexpr = 16 // BITS
    act: gl.constexpr = x_ptr.dtype.element_ty
    mma_layout: gl.constexpr = _mma_layout(KW)
    a_layout: gl.constexpr = gl.DotOperandLayout(0, mma_layout, 2)
    b_layout: gl.constexpr = gl.DotOperandLayout(1, mma_layout, 2)
    words_layout: gl.constexpr = _words_layout(KW)

    n0 = tile * 64
    first = pid_k * (KW * STEPS)

    g_w = gl.arange(0, KW, layout=gl.SliceLayout(1, gl.SliceLayout(2, words_layout)))
    rows_w = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, words_layout)))
    cols_w = gl.arange(0, 256, layout=gl.SliceLayout(0, gl.SliceLayout(1, words_layout)))
    w_offs = gl.expand_dims(gl.expand_dims(rows_w * 256, 0), 2) + gl.expand_dims(gl.expand_dims(cols_w, 0), 1)
    g_w = gl.expand_dims(gl.expand_dims(g_w, 1), 2)
    w_tile = w_ptr + tile.to(gl.int64) * blocks * 2048

    # Each accumulator (and operand) row's K-group and weight row.
    rows_c = gl.arange(0, KW * 64, layout=gl.SliceLayout(1, mma_layout))
    g_c, r_c = rows_c // 64, n0 + rows_c % 64
    rows_a = gl.arange(0, KW * 64, layout=gl.SliceLayout(1, a_layout))
    g_a, r_a = rows_a // 64, n0 + rows_a % 64

    gl.static_assert(DEPTH == 2 or DEPTH == 4, "DEPTH: 2 or 4 steps in flight")
    w_a, sa = _fetch(w_tile, w_offs, g_w, g_c, r_c, first, 0, blocks, s_ptr, NP, BITS, SG, STEPS)
    w_b, sb = _fetch(w_tile, w_offs, g_w, g_c, r_c, first, 1, blocks, s_ptr, NP, BITS, SG, STEPS)
    if DEPTH == 4:
        w_c, sc = _fetch(w_tile, w_offs, g_w, g_c, r_c, first, 2, blocks, s_ptr, NP, BITS, SG, STEPS)
        w_d, sd = _fetch(w_tile, w_offs, g_w, g_c, r_c, first, 3, blocks, s_ptr, NP, BITS, SG, STEPS)
    gl.static_assert(ROWS == 8 or (ROWS == 16 and KW == 1), "ROWS: 8, or 16 with one K-group")
    x_smem = gl.allocate_shared_memory(act, [STEPS * PAIRS, KW * ROWS, 32], _X_SHARED)
    if LOOKUP:
        # The barrier after x's staging makes the table visible before the first lookup.
        gl.static_assert(READ_ONLY == 0 and BITS == 4 and not HAS_ZEROS, "LOOKUP: 4-bit codes, the whole walk")
        lanes = gl.arange(0, 128 * KW, layout=gl.BlockedLayout([1], [32], [4 * KW], [0]))
        gl.inline_asm_elementwise(_FILL_ASM, "=r,l", [z_ptr + lanes % 16], dtype=gl.int32, is_pure=False, pack=1)
    if ROTATED:  # the weight's first steps are in flight while the rotation programs finish
        wait_rotated(sync_ptr, M, K, RCOLS)
    if READ_ONLY < 3:
        _stage_x(x_ptr, x_smem, M, K, stride_xm, first, KW, STEPS, PAIRS, EVEN_K, ROWS)
        gl.thread_barrier()
    if ROTATED:  # x is in shared memory: the workspace is free for the next launch
        arrive_rotated(sync_ptr, gl.num_programs(0) * split_k)
    acc = gl.zeros([KW * 64, KW * ROWS], gl.float32, mma_layout)
    # DEPTH steps a trip, each register set refilled right after its last use, DEPTH steps
    # ahead (no register copies between trips): while one step is dequantized and
    # multiplied the others' words and scales are in flight.
    if READ_ONLY > 0:
        wacc = gl.zeros([KW, 8, 256], gl.int16, words_layout)
        for b in range(0, STEPS, DEPTH):
            wacc = wacc ^ w_a
            w_a, sa = _fetch(w_tile, w_offs, g_w, g_c, r_c, first, gl.minimum(b + DEPTH, STEPS - 1), blocks, s_ptr, NP, BITS, SG, STEPS)
            wacc = wacc ^ w_b
            w_b, sb = _fetch(w_tile, w_offs, g_w, g_c, r_c, first, gl.minimum(b + DEPTH + 1, STEPS - 1), blocks, s_ptr, NP, BITS, SG, STEPS)
            if DEPTH == 4:
                wacc = wacc ^ w_c
                w_c, sc = _fetch(w_tile, w_offs, g_w, g_c, r_c, first, gl.minimum(b + 6, STEPS - 1), blocks, s_ptr, NP, BITS, SG, STEPS)
                wacc = wacc ^ w_d
                w_d, sd = _fetch(w_tile, w_offs, g_w, g_c, r_c, first, gl.minimum(b + 7, STEPS - 1), blocks, s_ptr, NP, BITS, SG, STEPS)
        acc += gl.sum(gl.sum(gl.sum(wacc.to(gl.float32), axis=2), axis=1), axis=0)
        acc += gl.sum(sa.to(gl.float32) + sb.to(gl.float32), axis=0)
        if DEPTH == 4:
            acc += gl.sum(sc.to(gl.float32) + sd.to(gl.float32), axis=0)
    else:
        for b in range(0, STEPS, DEPTH):
            acc = _block(acc, w_a, sa, b, first, blocks, x_smem, s_ptr, z_ptr, NP, g_a, r_a, g_c, r_c,
                         KW, STEPS, BITS, SG, CLOSE, HAS_ZEROS, act, mma_layout, a_layout, b_layout, ROWS, LOOKUP)
            w_a, sa = _fetch(w_tile, w_offs, g_w, g_c, r_c, first, gl.minimum(b + DEPTH, STEPS - 1), blocks, s_ptr, NP, BITS, SG, STEPS)
            if b + 1 < STEPS:
                acc = _block(acc, w_b, sb, b + 1, first, blocks, x_smem, s_ptr, z_ptr, NP, g_a, r_a, g_c, r_c,
                             KW, STEPS, BITS, SG, CLOSE, HAS_ZEROS, act, mma_layout, a_layout, b_layout, ROWS, LOOKUP)
            w_b, sb = _fetch(w_tile, w_offs, g_w, g_c, r_c, first, gl.minimum(b + DEPTH + 1, STEPS - 1), blocks, s_ptr, NP, BITS, SG, STEPS)
            if DEPTH == 4:
                if b + 2 < STEPS:
                    acc = _block(acc, w_c, sc, b + 2, first, blocks, x_smem, s_ptr, z_ptr, NP, g_a, r_a, g_c, r_c,
                                 KW, STEPS, BITS, SG, CLOSE, HAS_ZEROS, act, mma_layout, a_layout, b_layout, ROWS, LOOKUP)
                w_c, sc = _fetch(w_tile, w_offs, g_w, g_c, r_c, first, gl.minimum(b + 6, STEPS - 1), blocks, s_ptr, NP, BITS, SG, STEPS)
                if b + 3 < STEPS:
                    acc = _block(acc, w_d, sd, b + 3, first, blocks, x_smem, s_ptr, z_ptr, NP, g_a, r_a, g_c, r_c,
                                 KW, STEPS, BITS, SG, CLOSE, HAS_ZEROS, act, mma_layout, a_layout, b_layout, ROWS, LOOKUP)
                w_d, sd = _fetch(w_tile, w_offs, g_w, g_c, r_c, first, gl.minimum(b + 7, STEPS - 1), blocks, s_ptr, NP, BITS, SG, STEPS)
    out = acc if KW == 1 else _diagonal_sum(acc, KW, mma_layout)
    tile_store(out, tile, pid_k, n0, 0, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, split_k,
                SPLIT and READ_ONLY < 2, HAS_BIAS, 64, ROWS, 4 * KW, GATED)


def decode_grid(blocks: int, split: int, groups: int) -> tuple[int, int]:
    """``(steps, split)``: ``split`` programs of ``groups`` K-groups each cut a tile's
    blocks into runs of ``steps``, at least two (the walk's two register sets; one step does
    not compile); the last run may pass the end (:func:`whole_runs` says whether any does),
    no program is empty."""
    steps = max(2, -(-blocks // (max(1, split) * groups)))
    return steps, -(-blocks // (steps * groups))


def whole_runs(k: int, bits: int, blocks: int, steps: int, groups: int) -> bool:
    """The kernel's ``EVEN_K``: K fills whole blocks and every program's runs end inside the
    weight, so x is staged without a mask. A run past the end reads the last block again
    against x masked to zero there."""
    return k % (512 // bits) == 0 and blocks % (steps * groups) == 0


def compile_report(*, bits: int = 4, zeros: bool = False, fp16: bool = False, groups: int = 1, steps: int = 8,
                   sub_group: int = 128, depth: int = 2, rows: int = 8, lookup: bool = False,
                   gated: bool = False, rotate: int = 0, direct: bool = False) -> dict[str, object]:
    """Compile for sm_90a on any machine (Triton's bundled ptxas): registers, spill
    stack, shared memory and the opcode counts of the walk (the longest loop: ``depth`` steps
    of every K-group), per code a thread handles there, the end's atomics (the split-K
    ticket) and the whole kernel's global loads and stores by opcode (their widths)."""
    from quantcore.triton.compile_report import (
        backward_loops,
        compile_sm90,
        instructions,
        opcode_counts,
        opcodes_in,
    )

    act = "fp16" if fp16 else "bf16"
    sig = {"w_ptr": "*i16", "x_ptr": f"*{act}", "s_ptr": "*fp32" if lookup else "*fp16",
           "z_ptr": "*fp32" if lookup else "*u8", "b_ptr": "*fp16", "y_ptr": f"*{act}",
           "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32",
           "stride_ym": "i32", "NP": "i32", "blocks": "i32", "split_k": "i32", "rx_ptr": f"*{act}",
           "rot_ptr": f"*{act}", "sync_ptr": "*i32", "rot_rows": "i32"}
    pairs = 16 // bits
    close = max(1, min(pairs, sub_group // 32))
    const = dict(BITS=bits, SG=sub_group, CLOSE=close, HAS_ZEROS=zeros, HAS_BIAS=False, SPLIT=True, EVEN_K=True,
                 KW=groups, STEPS=steps, READ_ONLY=0, DEPTH=depth, ROWS=rows, LOOKUP=lookup, GATED=gated,
                 ROTATE=bool(rotate), RD=128, RCOLS=rotate or 128, RSHARED=True, RDIRECT=direct)
    compiled = compile_sm90(decode_kernel, sig, const, divisible=[a for a in sig if a not in ("M", "rot_rows")],
                            options={"num_warps": 4 * groups}, gluon=True)
    sass = compiled.sass
    ins = instructions(sass)
    walk = max(backward_loops(ins), key=lambda span: len(opcodes_in(ins, span)))
    counts = opcode_counts(opcodes_in(ins, walk))
    codes = depth * 64 * (512 // bits) / 128  # a trip's steps: 64 rows × a block's inputs over one group's 128 threads
    whole_kernel = opcode_counts(i.opcode for i in ins)
    end = {op: whole_kernel.get(op, 0) for op in ("ATOMG", "RED")}
    memory = dict(collections.Counter(i.opcode for i in ins if i.opcode.startswith(("LDG", "STG"))))

    return {"bits": bits, "zeros": zeros, "fp16": fp16, "groups": groups, "steps": steps, "sub_group": sub_group,
            "depth": depth, "rows": rows, "lookup": lookup, "gated": gated, "rotate": rotate, "end": end, "global_access": memory,
            "registers": compiled.registers, "spill_stack": compiled.spill_stack, "shared": compiled.shared,
            "walk": dict(counts), "per_code": round(sum(counts.values()) / codes, 2)}
