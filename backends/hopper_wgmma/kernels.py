"""The ``hopper_wgmma`` kernel: ``y = x·Ŵᵀ + b`` for GPTQ/AWQ 4- and 8-bit codes on sm_90a,
written in Gluon (Triton's explicit-layout dialect).

Swap-AB: the accumulator is ``acc[BN, BM] += Ŵ[BN, 32]·xᵀ[32, BM]``, the weight the
left operand of ``wgmma`` **from registers** (Hopper takes A from registers, B from
shared memory), so the activation side is wgmma's N (8…256): a decode step wastes
little, a prefill tile is 64·WG weight rows × up to 256 tokens.

One CTA walks a run of K blocks (``layout.py``: 128 inputs at 4 bits, 64 at 8) through
a ring of ``STAGES`` shared-memory stages that TMA fills: the block's weight words, the
``32·PAIRS`` columns of x it multiplies, and its scale and zero-point rows. Per block:

1. wait for the stage's barrier;
2. read the words, two 16-byte ``ld.shared`` per thread: the prepared layout puts each
   thread's fragment words together, and a reshape/permute turns them into the MMA's
   A-operand layout without moving data (``convert_layout(assert_trivial=True)``);
3. per slice of 32 inputs, dequantize in registers — one LOP3 and two packed FMAs per
   pair of codes (``(q − z)·s`` in the activation dtype) — and issue ``wgmma``
   asynchronously: slice i+1 is dequantized while slice i multiplies;
4. either (``IN_FLIGHT``) wait until only this block's groups are in flight — retiring
   the previous block's, whose stage goes back to TMA — so the next block is dequantized
   while this one multiplies; or, after ``PER_WAIT`` blocks (1 or 2), wait for every
   group and hand the stages back, ``STAGES`` blocks ahead.

An in-flight wgmma reads its A registers until the wait that retires it, so nothing may
write them before. The deps of ``warpgroup_mma_wait`` do not see to that: Triton lowers
them to a comment in the PTX, which ptxas ignores. What does is the walk itself: two
blocks per trip, so the operands of consecutive blocks are different values, hence
different PTX registers, and none is rewritten before its wait (with one block per trip
the next trip's operands *are* the same PTX registers — such plans computed wrong,
README.md). ``tools/probes/hopper_wgmma_hazards.py`` checks the SASS for it.

``WS`` (opt-in, README.md "Warp-specialised producer"): a producer warp issues every
block's TMA loads once the consumers hand its stage back on a second, "empty" barrier per
stage; the consumer warpgroups walk the in-flight order without issuing loads.

Split-K (programs over K runs of one tile) stores fp32 partials; the last program of a
tile to arrive sums them in split order (deterministic, one launch, no zeroed buffer).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from quantcore.kernels.gptq_pairs.ptx import offset_pair_asm_text, pair_asm_text
from quantcore.triton.gluon_split_k import let_dependents_launch, tile_store, wait_for_prior_grids

from .codebook import CODEBOOK_FILL_ASM, lookup_pair_asm_text
from .rotation_programs import ASYNC_READS, arrive_rotated, rotation_program, wait_rotated

__all__ = ["wgmma_kernel"]


def _asm_index(bits: int, fp16: bool, zero: bool, i: int) -> int:
    return (((bits == 8) * 2 + fp16) * 2 + zero) * 4 + i


#: Every scaled variant of :func:`~quantcore.kernels.gptq_pairs.ptx.pair_asm_text` at
#: :func:`_asm_index` (slice i is field i): the pair ``((q₀ − z)·s, (q₁ − z)·s)``.
_PAIR_ASM = gl.constexpr(tuple(
    pair_asm_text(bits, fp16, bits * i, zero, scaled=True) if i < 16 // bits else ""
    for bits in (4, 8) for fp16 in (False, True) for zero in (False, True) for i in range(4)
))


#: The unscaled 4-bit pairs ``(B + q₀, B + q₁)`` of a late-scale plan, at ``fp16·4 + i``.
_OFFSET_ASM = gl.constexpr(tuple(offset_pair_asm_text(fp16, 4 * i) for fp16 in (False, True) for i in range(4)))

#: The codebook pairs ``(c[q₀]·s, c[q₁]·s)`` of a ``LOOKUP`` program, at ``fp16·4 + i``.
_LOOKUP_ASM = gl.constexpr(tuple(lookup_pair_asm_text(fp16, 4 * i) for fp16 in (False, True) for i in range(4)))
_FILL_ASM = gl.constexpr(CODEBOOK_FILL_ASM)


@gluon.constexpr_function
def _mma_layout(wg, bm):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * wg, 1], instr_shape=[16, bm, 16])


@gluon.constexpr_function
def _words_layout(wg):
    # [WG, 8, 256] int16 of one block: row 4h + w, column 8·lane + 2j + b (layout.py);
    # one warp reads rows w and 4 + w, 16 contiguous bytes per thread per row.
    return gl.BlockedLayout([1, 1, 8], [1, 1, 32], [wg, 4, 1], [2, 1, 0])


@gluon.constexpr_function
def _tile_layout(box_layout):
    return gl.NVMMASharedLayout(swizzle_byte_width=box_layout.swizzle_byte_width,
                                element_bitwidth=box_layout.element_bitwidth, rank=2)


@gluon.constexpr_function
def _slots(nbytes):
    return max(1, 128 // nbytes)


@gluon.jit
def _operand(w16, s_row, z_row, SL: gl.constexpr, BITS: gl.constexpr,
             HAS_ZEROS: gl.constexpr, act: gl.constexpr, a_layout: gl.constexpr, BN: gl.constexpr,
             LOOKUP: gl.constexpr = False):
    """Slice ``SL`` of the block: ``(q − z)·s`` as wgmma's A operand [BN, 32]; with
    ``LOOKUP`` (4-bit codes, float32 scales) ``c[q]·s`` from the codebook table."""
    WIDE: gl.constexpr = BITS == 8 and act == gl.bfloat16
    # [BN, 1] in the operand's own layout: each thread reads the rows it holds, and the
    # broadcast to [BN, 32] below moves nothing.
    s = s_row.permute((1, 0)).load(a_layout).to(gl.float32)
    if LOOKUP:
        sin = gl.broadcast(s, w16)[0]
        return gl.inline_asm_elementwise(_LOOKUP_ASM[(act == gl.float16) * 4 + SL], "=r,r,r,r", [w16, sin],
                                         dtype=act.value, is_pure=True, pack=2)
    if HAS_ZEROS:
        z = z_row.permute((1, 0)).load(a_layout).to(gl.float32)
    else:
        z = gl.full([BN, 1], 8.0 if BITS == 4 else 128.0, gl.float32, a_layout)
    IDX: gl.constexpr = (((BITS == 8) * 2 + (act == gl.float16)) * 2 + HAS_ZEROS) * 4 + SL
    if WIDE:
        zin = gl.broadcast(8388608.0 + z, w16)[0]
        sin = gl.broadcast(s, w16)[0]
        if HAS_ZEROS:
            out = gl.inline_asm_elementwise(_PAIR_ASM[IDX], "=r,r,r,r,r,r", [w16, zin, sin],
                                            dtype=gl.bfloat16, is_pure=True, pack=2)
        else:
            out = gl.inline_asm_elementwise(_PAIR_ASM[IDX], "=r,r,r,r", [w16, sin],
                                            dtype=gl.bfloat16, is_pure=True, pack=2)
    else:
        base: gl.constexpr = 1024.0 if act == gl.float16 else 128.0
        sin = gl.broadcast(s.to(act), w16)[0]
        if HAS_ZEROS:
            zin = gl.broadcast((-(base + z)).to(act), w16)[0]
            out = gl.inline_asm_elementwise(_PAIR_ASM[IDX], "=r,r,r,r", [w16, zin, sin],
                                            dtype=act.value, is_pure=True, pack=2)
        else:
            out = gl.inline_asm_elementwise(_PAIR_ASM[IDX], "=r,r,r", [w16, sin],
                                            dtype=act.value, is_pure=True, pack=2)
    return out


#: What :func:`_issue` loads: everything, the weight's side only (words, scales, zero
#: points; the barrier told to expect the whole stage), or x's tiles only.
ALL: gl.constexpr = gl.constexpr(0)
WEIGHT_SIDE: gl.constexpr = gl.constexpr(1)
X_SIDE: gl.constexpr = gl.constexpr(2)


@gluon.jit
def _issue(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, stage, blk,
           tile_n, m0, n0, sub_group, BK: gl.constexpr, PAIRS: gl.constexpr, ROWS: gl.constexpr,
           HAS_ZEROS: gl.constexpr, S_PAD: gl.constexpr, Z_PAD: gl.constexpr, PART: gl.constexpr = ALL):
    """TMA loads of block ``blk`` into ``stage``, completing on its barrier: its words,
    the x tiles of its slices, and its ``ROWS`` rows of scales (and zero points); ``PART``
    splits them in two (the barrier completes once both halves have arrived)."""
    NBYTES: gl.constexpr = (w_desc.block_type.nbytes + x_desc.block_type.nbytes
                            + ROWS * (s_desc.block_type.nbytes + (z_desc.block_type.nbytes if HAS_ZEROS else 0)))
    b = bar.index(stage)
    if PART != X_SIDE:
        mbarrier.expect(b, NBYTES)
        tma.async_copy_global_to_shared(w_desc, [tile_n, blk * 8, 0], b, w_smem.index(stage))
        row = (blk * BK) // sub_group
        for r in gl.static_range(ROWS):
            tma.async_copy_global_to_shared(s_desc, [row + r, n0], b, s_smem.index((stage * ROWS + r) * S_PAD))
            if HAS_ZEROS:
                tma.async_copy_global_to_shared(z_desc, [row + r, n0], b, z_smem.index((stage * ROWS + r) * Z_PAD))
    if PART != WEIGHT_SIDE:
        x_box = x_smem._reinterpret(x_desc.dtype, [x_smem.shape[0] // PAIRS] + x_desc.block_type.shape, x_desc.layout)  # noqa: RUF005 - Gluon parses list concatenation, not unpacking
        tma.async_copy_global_to_shared(x_desc, [blk * PAIRS, m0, 0], b, x_box.index(stage))


@gluon.jit
def _stage_words(stage, lap, w_smem, bar, WG: gl.constexpr, BN: gl.constexpr, mma_layout: gl.constexpr,
                 words_layout: gl.constexpr):
    """Waits for ``stage`` (its ``lap``-th fill) and reads its words as wgmma's A-operand
    layout: a reshape/permute of the two 16-byte loads per thread, which moves no data."""
    mbarrier.wait(bar.index(stage), lap & 1)
    words = w_smem.index(stage).load(words_layout)  # [WG, 8, 256]
    w7 = gl.reshape(words, [WG, 2, 4, 8, 4, 4, 2])  # (wg, h, w, g, t, j, b)
    w7 = gl.permute(w7, [0, 2, 1, 3, 5, 4, 6])  # (wg, w, h, g, j, t, b)
    return gl.convert_layout(gl.reshape(w7, [BN, 32]), gl.DotOperandLayout(0, mma_layout, 2), assert_trivial=True)


@gluon.jit
def _block(acc, i, w_smem, x_smem, s_smem, z_smem, bar,
           STAGES: gl.constexpr, PAIRS: gl.constexpr, ROWS: gl.constexpr, SLICES_PER_ROW: gl.constexpr,
           BITS: gl.constexpr, HAS_ZEROS: gl.constexpr, S_PAD: gl.constexpr, Z_PAD: gl.constexpr,
           WG: gl.constexpr, BN: gl.constexpr, act: gl.constexpr, mma_layout: gl.constexpr,
           a_layout: gl.constexpr, words_layout: gl.constexpr, LOOKUP: gl.constexpr = False):
    """The ``i``-th block of this program: wait for its stage, read its words, and per
    slice dequantize and issue an asynchronous wgmma (not waited for here)."""
    stage = i % STAGES
    w16 = _stage_words(stage, i // STAGES, w_smem, bar, WG, BN, mma_layout, words_layout)
    for sl in gl.static_range(PAIRS):
        row = stage * ROWS + sl // SLICES_PER_ROW
        a = _operand(w16, s_smem.index(row * S_PAD), z_smem.index(row * Z_PAD), sl, BITS, HAS_ZEROS, act,
                     a_layout, BN, LOOKUP)
        acc = warpgroup_mma(a, x_smem.index(stage * PAIRS + sl).permute((1, 0)), acc, is_async=True)
    return acc


@gluon.jit
def _block_late(part, xsum, ones, i, w_smem, x_smem, bar, STAGES: gl.constexpr, PAIRS: gl.constexpr,
                WG: gl.constexpr, BN: gl.constexpr, act: gl.constexpr, mma_layout: gl.constexpr,
                words_layout: gl.constexpr):
    """The ``i``-th block of a late-scale program: ``part = Σ (B + q)·x`` over the block and
    ``xsum = Σ x`` (a wgmma of ``ones``: every row the same), both started afresh and
    issued asynchronously, not waited for here."""
    stage = i % STAGES
    w16 = _stage_words(stage, i // STAGES, w_smem, bar, WG, BN, mma_layout, words_layout)
    for sl in gl.static_range(PAIRS):
        a = gl.inline_asm_elementwise(_OFFSET_ASM[(act == gl.float16) * 4 + sl], "=r,r", [w16],
                                      dtype=act.value, is_pure=True, pack=2)
        xs = x_smem.index(stage * PAIRS + sl).permute((1, 0))
        part = warpgroup_mma(a, xs, part, use_acc=sl > 0, is_async=True)
        xsum = warpgroup_mma(ones, xs, xsum, use_acc=sl > 0, is_async=True)
    return part, xsum


@gluon.jit
def _fold(acc, part, xsum, stage, s_smem, z_smem, BITS: gl.constexpr, HAS_ZEROS: gl.constexpr,
          S_PAD: gl.constexpr, Z_PAD: gl.constexpr, act: gl.constexpr, mma_layout: gl.constexpr):
    """``acc += s·(part − (B + z)·xsum)`` for the retired block in ``stage`` (one scale row
    per block): the operand's offset ``B`` and the zero point come off in fp32, exactly
    enough (the products are exact; the sums' rounding is fp32's)."""
    BASE: gl.constexpr = 1024.0 if act == gl.float16 else 128.0
    # [BN, 1] in the accumulator's own layout: each thread reads the rows it holds.
    s = s_smem.index(stage * S_PAD).permute((1, 0)).load(mma_layout).to(gl.float32)
    if HAS_ZEROS:
        zb = z_smem.index(stage * Z_PAD).permute((1, 0)).load(mma_layout).to(gl.float32) + BASE
    else:
        zb = gl.full([1, 1], BASE + (8.0 if BITS == 4 else 128.0), gl.float32, mma_layout)
    return acc + s * (part - zb * xsum)


@gluon.jit
def _late_pair(acc, ones, j, w_smem, x_smem, s_smem, z_smem, bar, STAGES: gl.constexpr, PAIRS: gl.constexpr,
               BITS: gl.constexpr, HAS_ZEROS: gl.constexpr, S_PAD: gl.constexpr, Z_PAD: gl.constexpr,
               WG: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr, act: gl.constexpr, mma_layout: gl.constexpr,
               words_layout: gl.constexpr):
    """Blocks ``j`` and ``j + 1`` of a late-scale program, folded into ``acc``: the second
    block is dequantized while the first multiplies, the first folded while the second
    multiplies, and every group retired on return — ptxas follows a wgmma's accumulator
    only within the loop body; a fold reading one issued in the previous trip would make
    it serialize every wgmma (C7514)."""
    part_a = gl.zeros([BN, BM], gl.float32, mma_layout)
    sum_a = gl.zeros([BN, BM], gl.float32, mma_layout)
    part_b = gl.zeros([BN, BM], gl.float32, mma_layout)
    sum_b = gl.zeros([BN, BM], gl.float32, mma_layout)
    part_a, sum_a = _block_late(part_a, sum_a, ones, j, w_smem, x_smem, bar, STAGES, PAIRS, WG, BN, act,
                                mma_layout, words_layout)
    part_b, sum_b = _block_late(part_b, sum_b, ones, j + 1, w_smem, x_smem, bar, STAGES, PAIRS, WG, BN, act,
                                mma_layout, words_layout)
    part_a, sum_a, part_b, sum_b = warpgroup_mma_wait(num_outstanding=2 * PAIRS, deps=(part_a, sum_a, part_b, sum_b))
    acc = _fold(acc, part_a, sum_a, j % STAGES, s_smem, z_smem, BITS, HAS_ZEROS, S_PAD, Z_PAD, act, mma_layout)
    part_a, sum_a, part_b, sum_b = warpgroup_mma_wait(num_outstanding=0, deps=(part_a, sum_a, part_b, sum_b))
    return _fold(acc, part_b, sum_b, (j + 1) % STAGES, s_smem, z_smem, BITS, HAS_ZEROS, S_PAD, Z_PAD, act,
                 mma_layout)


@gluon.jit
def _ws_consume_late(acc, ones, w_smem, x_smem, s_smem, z_smem, full, empty, n_iter,
                     STAGES: gl.constexpr, PAIRS: gl.constexpr, BITS: gl.constexpr, HAS_ZEROS: gl.constexpr,
                     S_PAD: gl.constexpr, Z_PAD: gl.constexpr, WG: gl.constexpr, BN: gl.constexpr,
                     BM: gl.constexpr, act: gl.constexpr, mma_layout: gl.constexpr, words_layout: gl.constexpr):
    """The consumer warpgroups of a warp-specialised late-scale program: pairs of blocks
    (:func:`_late_pair`), both stages handed back on their ``empty`` barriers."""
    gl.assume(n_iter > 0)
    for j in range(0, n_iter, 2):
        acc = _late_pair(acc, ones, j, w_smem, x_smem, s_smem, z_smem, full, STAGES, PAIRS, BITS, HAS_ZEROS,
                         S_PAD, Z_PAD, WG, BN, BM, act, mma_layout, words_layout)
        for u in gl.static_range(2):
            mbarrier.arrive(empty.index((j + u) % STAGES), pred=j + u + STAGES < n_iter)
    return (acc,)


@gluon.jit
def _ws_consume(acc, w_smem, x_smem, s_smem, z_smem, full, empty, n_iter,
                STAGES: gl.constexpr, PAIRS: gl.constexpr, ROWS: gl.constexpr, SLICES_PER_ROW: gl.constexpr,
                BITS: gl.constexpr, HAS_ZEROS: gl.constexpr, S_PAD: gl.constexpr, Z_PAD: gl.constexpr,
                WG: gl.constexpr, BN: gl.constexpr, act: gl.constexpr, mma_layout: gl.constexpr,
                a_layout: gl.constexpr, words_layout: gl.constexpr, LOOKUP: gl.constexpr = False):
    """The consumer warpgroups of a warp-specialised program: the in-flight walk (two blocks
    per trip, the previous block's groups retired after each), handing each retired
    block's stage back on its ``empty`` barrier instead of refilling it."""
    gl.assume(n_iter > 0)
    for j in range(0, n_iter, 2):
        for u in gl.static_range(2):
            acc = _block(acc, j + u, w_smem, x_smem, s_smem, z_smem, full, STAGES, PAIRS, ROWS, SLICES_PER_ROW,
                         BITS, HAS_ZEROS, S_PAD, Z_PAD, WG, BN, act, mma_layout, a_layout, words_layout, LOOKUP)
            acc = warpgroup_mma_wait(num_outstanding=PAIRS, deps=(acc,))
            done = j + u - 1
            mbarrier.arrive(empty.index((done + STAGES) % STAGES), pred=(done >= 0) & (done + STAGES < n_iter))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return (acc,)


@gluon.jit
def _ws_produce(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, full, empty, n_iter, blk0,
                tile_n, m0, n0, sub_group, STAGES: gl.constexpr, BK: gl.constexpr, PAIRS: gl.constexpr,
                ROWS: gl.constexpr, HAS_ZEROS: gl.constexpr, S_PAD: gl.constexpr, Z_PAD: gl.constexpr):
    """The producer warp of a warp-specialised program: every block's TMA loads, each once
    the consumers have handed its stage back (the ring's first fill waits for nothing)."""
    for i in range(n_iter):
        stage = i % STAGES
        mbarrier.wait(empty.index(stage), ((i // STAGES) - 1) & 1, pred=i >= STAGES)
        _issue(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, full, stage, blk0 + i,
               tile_n, m0, n0, sub_group, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD)


@gluon.jit
def _issue_next(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, stage, blk, pid_m, pid_n, blocks,
                num_m, sub_group, BK: gl.constexpr, PAIRS: gl.constexpr, ROWS: gl.constexpr, HAS_ZEROS: gl.constexpr,
                S_PAD: gl.constexpr, Z_PAD: gl.constexpr, WG: gl.constexpr, BM: gl.constexpr):
    """A balanced grid's loads of its next block (block ``blk`` of tile ``(pid_n, pid_m)``)
    into ``stage``; returns the block after it in the launch's one sequence (each tile's K
    blocks, the tiles in program order), stepped on, not divided out, in the loop."""
    _issue(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, stage, blk, pid_n * WG, pid_m * BM,
           pid_n * (64 * WG), sub_group, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD)
    blk += 1
    wrap = (blk == blocks).to(gl.int32)
    blk -= wrap * blocks
    pid_m += wrap
    wrap_m = (pid_m == num_m).to(gl.int32)
    pid_m -= wrap_m * num_m
    pid_n += wrap_m
    return blk, pid_m, pid_n


@gluon.jit
def _stream_store(acc, tile, u, seg_end, pairs, units, pid, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, num_m,
                  HAS_BIAS: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr, NUM_WARPS: gl.constexpr):
    """A balanced grid's end of one run of a tile's pairs ``[u, seg_end)``: a whole tile is
    stored; a part goes to the workspace slot of its program's rank among the tile's
    programs, and the last of them to arrive sums the slots in rank order (deterministic)."""
    start = tile * pairs
    n0 = (tile // num_m) * BN
    m0 = (tile % num_m) * BM
    if (u == start) & (seg_end == start + pairs):
        tile_store(acc, tile, 0, n0, m0, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, 1, False, HAS_BIAS, BN,
                    BM, NUM_WARPS)
    else:
        # The programs of a tile: those whose run [g·units/grid, (g+1)·units/grid) holds one of its pairs.
        grid = gl.num_programs(0)
        first = ((start + 1) * grid - 1) // units
        last = ((start + pairs) * grid - 1) // units
        tile_store(acc, tile, pid - first, n0, m0, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, last - first + 1,
                    True, HAS_BIAS, BN, BM, NUM_WARPS)


@gluon.jit
def _fill(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, n_iter, blk0, tile_n, m0, n0,
          sub_group, STAGES: gl.constexpr, BK: gl.constexpr, PAIRS: gl.constexpr, ROWS: gl.constexpr,
          HAS_ZEROS: gl.constexpr, S_PAD: gl.constexpr, Z_PAD: gl.constexpr, PART: gl.constexpr = ALL):
    """The ring's first fill: the loads (``PART`` of them) of the first ``STAGES`` blocks
    of the ``n_iter`` from ``blk0``."""
    for p in gl.static_range(STAGES):
        if p < n_iter:
            _issue(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, p, blk0 + p, tile_n, m0, n0,
                   sub_group, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD, PART)


@gluon.jit
def _in_flight(acc, w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, n_iter, blk0, tile_n, m0,
               n0, sub_group, STAGES: gl.constexpr, PAIRS: gl.constexpr, ROWS: gl.constexpr,
               SLICES_PER_ROW: gl.constexpr, BITS: gl.constexpr, HAS_ZEROS: gl.constexpr, S_PAD: gl.constexpr,
               Z_PAD: gl.constexpr, WG: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, act: gl.constexpr,
               mma_layout: gl.constexpr, a_layout: gl.constexpr, words_layout: gl.constexpr,
               LOOKUP: gl.constexpr = False):
    """The in-flight walk of ``n_iter`` blocks from ``blk0`` (the ring filled before it):
    two blocks per trip (the module's docstring says why; the launcher gives every program
    an even block count), each block's groups left in flight while the next is dequantized,
    every group retired on return."""
    for j in range(0, n_iter, 2):
        for u in gl.static_range(2):
            acc = _block(acc, j + u, w_smem, x_smem, s_smem, z_smem, bar, STAGES, PAIRS, ROWS, SLICES_PER_ROW,
                         BITS, HAS_ZEROS, S_PAD, Z_PAD, WG, BN, act, mma_layout, a_layout, words_layout, LOOKUP)
            acc = warpgroup_mma_wait(num_outstanding=PAIRS, deps=(acc,))
            # The previous block's groups are done: once every warp is here, its stage
            # (weights and the x tiles those groups read) goes back to TMA.
            gl.thread_barrier()
            done = j + u - 1
            if done >= 0 and done + STAGES < n_iter:
                _issue(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, done % STAGES,
                       blk0 + done + STAGES, tile_n, m0, n0, sub_group, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _fill_codebook(cb_ptr, NUM_WARPS: gl.constexpr):
    """The codebook's 16 float32 centroids into the static table the lookups read
    (``codebook.py``), visible to every thread on return."""
    lanes = gl.arange(0, 32 * NUM_WARPS, layout=gl.BlockedLayout([1], [32], [NUM_WARPS], [0]))
    gl.inline_asm_elementwise(_FILL_ASM, "=r,l", [cb_ptr + lanes % 16], dtype=gl.int32, is_pure=False,
                              pack=1)
    gl.thread_barrier()


@gluon.jit
def _ring(w_desc, x_desc, s_desc, z_desc, STAGES: gl.constexpr, PAIRS: gl.constexpr, ROWS: gl.constexpr,
          HAS_ZEROS: gl.constexpr, BM: gl.constexpr, WS: gl.constexpr):
    """The ring of ``STAGES`` shared-memory stages that TMA fills — per stage a block's words,
    its slices of x, its ``ROWS`` scale (and zero-point) rows — and each stage's "full"
    barrier, and with ``WS`` its "empty" one: ``(w, x, s, z, full, empty)`` (without zero
    points ``z`` is ``s``; without ``WS`` ``empty`` is ``full``)."""
    w_smem = gl.allocate_shared_memory(gl.int16, [STAGES] + w_desc.block_type.shape, w_desc.layout)  # noqa: RUF005 - Gluon parses list concatenation, not unpacking
    # One [BM, 32] tile per slice (the TMA box [PAIRS, BM, 32] is PAIRS of them).
    x_smem = gl.allocate_shared_memory(x_desc.dtype, [STAGES * PAIRS, BM, 32], _tile_layout(x_desc.layout))
    # TMA writes shared memory at 128-byte aligned addresses: small boxes get padded slots.
    S_PAD: gl.constexpr = _slots(s_desc.block_type.nbytes)
    Z_PAD: gl.constexpr = _slots(z_desc.block_type.nbytes)
    s_smem = gl.allocate_shared_memory(s_desc.dtype, [STAGES * ROWS * S_PAD] + s_desc.block_type.shape, s_desc.layout)  # noqa: RUF005 - Gluon parses list concatenation, not unpacking
    if HAS_ZEROS:
        z_smem = gl.allocate_shared_memory(z_desc.dtype, [STAGES * ROWS * Z_PAD] + z_desc.block_type.shape,  # noqa: RUF005 - Gluon parses list concatenation, not unpacking
                                           z_desc.layout)
    else:
        z_smem = s_smem
    bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for st in gl.static_range(STAGES):
        mbarrier.init(bar.index(st), count=1)
    if WS:
        # Per stage, "empty": the consumers are done with its block. Gluon's arrive is one
        # thread's, after a barrier over the consumer warps (the compiler's), so one arrival.
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for st in gl.static_range(STAGES):
            mbarrier.init(empty.index(st), count=1)
    else:
        empty = bar
    return w_smem, x_smem, s_smem, z_smem, bar, empty


@gluon.jit
def wgmma_kernel(
    w_desc, x_desc, s_desc, z_desc, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, stride_ym, blocks, steps, split_k, sub_group, rx_ptr, rot_ptr, xr_ptr, sync_ptr, rot_rows,
    BITS: gl.constexpr, ROWS: gl.constexpr, SLICES_PER_ROW: gl.constexpr, SPLIT: gl.constexpr,
    HAS_ZEROS: gl.constexpr, HAS_BIAS: gl.constexpr,
    WG: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, PER_WAIT: gl.constexpr,
    IN_FLIGHT: gl.constexpr, PDL: gl.constexpr = 0, WS: gl.constexpr = False, LATE: gl.constexpr = False,
    STREAM: gl.constexpr = False, LOOKUP: gl.constexpr = False, GATED: gl.constexpr = False,
    ROTATE: gl.constexpr = False, RD: gl.constexpr = 128, RCOLS: gl.constexpr = 128, RSHARED: gl.constexpr = True,
    RDIRECT: gl.constexpr = False,
):
    """``w_desc``: the prepared words as int16 ``[tiles, blocks·8, 256]`` (box ``[WG, 8,
    256]``); ``x_desc``: x viewed as ``[K/32, M, 32]`` (box ``[PAIRS, BM, 32]``: one
    block's slices, each a ``[BM, 32]`` tile); ``s_desc``/``z_desc``: scale and
    zero-point rows per sub-group ``[subs, Np]`` (box ``[1, 64·WG]``, ``ROWS`` per block).
    ``IN_FLIGHT``: a wait per block leaves its groups in flight; else ``PER_WAIT`` blocks
    (1 or 2) between two full waits. Both pairs of blocks need an even block count per
    program. ``WS`` (with ``IN_FLIGHT``, ``PDL`` 0): a producer warp issues the loads.
    ``LATE`` (with ``IN_FLIGHT``; 4-bit, ``ROWS`` 1): scale late (``plans.Plan``).
    ``STREAM`` (with ``IN_FLIGHT``, without ``WS``, ``LATE``, ``PDL``; a 1-D grid): a
    balanced grid (``plans.Plan.stream``); ``split_k`` is then its workspace's slots.
    ``LOOKUP`` (4-bit codes, float32 scales, without ``HAS_ZEROS``, ``HAS_BIAS``, ``LATE``,
    ``STREAM``): the weight is ``c[q]·s`` of a codebook (``codebook.py``) whose 16 float32
    centroids ``b_ptr`` points to, in place of a bias (the caller adds a codebook layer's).
    ``GATED`` (without ``STREAM`` and ``LOOKUP``; N/2 a multiple of ``64·WG``): ``y`` is
    ``[M, N/2]``, ``silu(gate) · up`` of the N outputs (gate's then up's), every tile's part
    through the workspace (``quantcore/triton/gluon_split_k.py``). ``ROTATE`` (``LOOKUP``,
    without ``STREAM`` and ``PDL``): a TurboQuant layer's rotation in the same launch
    (``rotation_programs.py``): ``rot_rows`` rows of rotation programs in front along y rotate
    ``rx_ptr`` (the layer's x, ``[M, K·RD/RCOLS]``) by ``rot_ptr`` (``[R, RD, RCOLS]``, R = 1
    with ``RSHARED``; its transpose with ``RDIRECT``: ``rotate_chunk``) into ``xr_ptr`` (the
    workspace ``x_desc`` describes, ``[M, K]``, K = ``blocks`` blocks); ``sync_ptr``: their
    two int32 counts. Without it those five are unused."""
    pid_y = gl.program_id(1)
    if ROTATE:
        gl.static_assert(LOOKUP and not STREAM and PDL == 0, "ROTATE: a codebook weight, no balanced grid or PDL")
        if pid_y < rot_rows:
            rotation_program(rx_ptr, rot_ptr, xr_ptr, sync_ptr, pid_y, M, blocks * (512 // BITS), RD, RCOLS, RSHARED,
                             4 * WG, RDIRECT)
        else:
            _wgmma_program(w_desc, x_desc, s_desc, z_desc, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, blocks,
                           steps, split_k, sub_group, sync_ptr, pid_y - rot_rows, BITS, ROWS, SLICES_PER_ROW, SPLIT,
                           HAS_ZEROS, HAS_BIAS, WG, BM, STAGES, PER_WAIT, IN_FLIGHT, PDL, WS, LATE, STREAM, LOOKUP,
                           GATED, True, RCOLS)
    else:
        _wgmma_program(w_desc, x_desc, s_desc, z_desc, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, blocks, steps,
                       split_k, sub_group, sync_ptr, pid_y, BITS, ROWS, SLICES_PER_ROW, SPLIT, HAS_ZEROS, HAS_BIAS,
                       WG, BM, STAGES, PER_WAIT, IN_FLIGHT, PDL, WS, LATE, STREAM, LOOKUP, GATED, False, RCOLS)


@gluon.jit
def _wgmma_program(
    w_desc, x_desc, s_desc, z_desc, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, stride_ym, blocks, steps, split_k, sub_group, sync_ptr, pid_k,
    BITS: gl.constexpr, ROWS: gl.constexpr, SLICES_PER_ROW: gl.constexpr, SPLIT: gl.constexpr,
    HAS_ZEROS: gl.constexpr, HAS_BIAS: gl.constexpr,
    WG: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, PER_WAIT: gl.constexpr,
    IN_FLIGHT: gl.constexpr, PDL: gl.constexpr, WS: gl.constexpr, LATE: gl.constexpr,
    STREAM: gl.constexpr, LOOKUP: gl.constexpr, GATED: gl.constexpr, ROTATED: gl.constexpr, RCOLS: gl.constexpr,
):
    """Program ``(program_id(0), pid_k)`` of the code matrix (:func:`wgmma_kernel`);
    ``ROTATED``: x is the workspace the launch's rotation programs fill, waited for before
    its first load (the weight's first stages are issued before the wait)."""
    PAIRS: gl.constexpr = 16 // BITS
    BK: gl.constexpr = 32 * PAIRS
    BN: gl.constexpr = 64 * WG
    NUM_WARPS: gl.constexpr = 4 * WG
    act: gl.constexpr = x_desc.dtype
    mma_layout: gl.constexpr = _mma_layout(WG, BM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    words_layout: gl.constexpr = _words_layout(WG)

    pid = gl.program_id(0)
    num_m = gl.cdiv(M, BM)
    pid_n = pid // num_m
    pid_m = pid % num_m
    m0 = pid_m * BM
    n0 = pid_n * BN
    tile_n = pid_n * WG
    blk0 = pid_k * steps
    n_iter = gl.minimum(blocks - blk0, steps)
    # The launcher gives every program at least one block. Said here, the compiler drops
    # the zero-trip path, whose second definition of the accumulator would make ptxas
    # serialize the wgmma pipeline (C7515).
    gl.assume(n_iter > 0)

    S_PAD: gl.constexpr = _slots(s_desc.block_type.nbytes)
    Z_PAD: gl.constexpr = _slots(z_desc.block_type.nbytes)
    w_smem, x_smem, s_smem, z_smem, bar, empty = _ring(w_desc, x_desc, s_desc, z_desc, STAGES, PAIRS, ROWS,
                                                       HAS_ZEROS, BM, WS)
    if LOOKUP:
        gl.static_assert(BITS == 4 and not HAS_ZEROS and not HAS_BIAS and not LATE and not STREAM,
                         "LOOKUP: 4-bit codes, no zero points, bias, late scale or balanced grid")
        _fill_codebook(b_ptr, NUM_WARPS)
    gl.static_assert(not GATED or (not STREAM and not LOOKUP), "GATED: without a balanced grid or a codebook")
    if LATE:
        # Ones, the A operand of the wgmma that sums x, from shared memory: from registers
        # ptxas rebuilds the constant for every wgmma (four moves each, the registers held).
        ones = gl.allocate_shared_memory(act, [BN, 32], _tile_layout(x_desc.layout))
        ones.store(gl.full([BN, 32], 1.0, act, gl.BlockedLayout([1, 8], [8, 4], [NUM_WARPS, 1], [1, 0])))
    else:
        ones = x_smem
    fence_async_shared()

    if PDL == 2:
        # The weight's first stages are read before the prior grids finish (only what they
        # cannot have written: docs/pdl.md); x and every write wait for them.
        _fill(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, n_iter, blk0, tile_n, m0, n0,
              sub_group, STAGES, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD, WEIGHT_SIDE)
        wait_for_prior_grids()
        _fill(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, n_iter, blk0, tile_n, m0, n0,
              sub_group, STAGES, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD, X_SIDE)
    elif ROTATED and not WS:
        # The weight's first stages are read while the rotation programs finish; x waits for them.
        _fill(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, n_iter, blk0, tile_n, m0, n0,
              sub_group, STAGES, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD, WEIGHT_SIDE)
        wait_rotated(sync_ptr, M, blocks * BK, RCOLS, ASYNC_READS)
        _fill(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, n_iter, blk0, tile_n, m0, n0,
              sub_group, STAGES, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD, X_SIDE)
    elif not WS and not STREAM:  # with WS the producer partition fills the ring
        if PDL == 1:
            wait_for_prior_grids()
        _fill(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, n_iter, blk0, tile_n, m0, n0,
              sub_group, STAGES, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD)
    elif ROTATED:  # the producer partition's first load of x comes after this
        wait_rotated(sync_ptr, M, blocks * BK, RCOLS, ASYNC_READS)

    acc = gl.zeros([BN, BM], gl.float32, mma_layout)
    if STREAM:
        # One sequence of (tile, pair of K blocks), cut into equal runs, one per program;
        # the ring walks this program's run straight through, across tile boundaries.
        pairs = blocks // 2
        units = num_m * gl.cdiv(N, BN) * pairs
        grid = gl.num_programs(0)
        lo = (pid * units) // grid
        hi = ((pid + 1) * units) // grid
        nb = 2 * (hi - lo)
        # The next block to load: block, row tile and column tile of the sequence.
        tile0 = lo // pairs
        nxt_blk = 2 * (lo - tile0 * pairs)
        nxt_m = tile0 % num_m
        nxt_n = tile0 // num_m
        for p in gl.static_range(STAGES):
            if p < nb:
                nxt_blk, nxt_m, nxt_n = _issue_next(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem,
                                                    bar, p, nxt_blk, nxt_m, nxt_n, blocks, num_m, sub_group, BK,
                                                    PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD, WG, BM)
        u = lo
        while u < hi:
            tile = u // pairs
            seg_end = gl.minimum(hi, (tile + 1) * pairs)
            acc = gl.zeros([BN, BM], gl.float32, mma_layout)
            for j in range(2 * (u - lo), 2 * (seg_end - lo), 2):
                for v in gl.static_range(2):
                    acc = _block(acc, j + v, w_smem, x_smem, s_smem, z_smem, bar, STAGES, PAIRS, ROWS,
                                 SLICES_PER_ROW, BITS, HAS_ZEROS, S_PAD, Z_PAD, WG, BN, act, mma_layout, a_layout,
                                 words_layout)
                    acc = warpgroup_mma_wait(num_outstanding=PAIRS, deps=(acc,))
                    gl.thread_barrier()
                    done = j + v - 1
                    if done >= 0 and done + STAGES < nb:
                        nxt_blk, nxt_m, nxt_n = _issue_next(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem,
                                                            z_smem, bar, done % STAGES, nxt_blk, nxt_m, nxt_n,
                                                            blocks, num_m, sub_group, BK, PAIRS, ROWS, HAS_ZEROS,
                                                            S_PAD, Z_PAD, WG, BM)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            _stream_store(acc, tile, u, seg_end, pairs, units, pid, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym,
                          num_m, HAS_BIAS, BN, BM, NUM_WARPS)
            u = seg_end
    elif WS and LATE:
        acc = gl.warp_specialize(
            [(_ws_consume_late, (acc, ones, w_smem, x_smem, s_smem, z_smem, bar, empty, n_iter, STAGES, PAIRS,
                                 BITS, HAS_ZEROS, S_PAD, Z_PAD, WG, BN, BM, act, mma_layout, words_layout)),
             (_ws_produce, (w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, empty, n_iter,
                            blk0, tile_n, m0, n0, sub_group, STAGES, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD))],
            [1], [24])[0]
    elif WS:
        acc = gl.warp_specialize(
            [(_ws_consume, (acc, w_smem, x_smem, s_smem, z_smem, bar, empty, n_iter, STAGES, PAIRS, ROWS,
                            SLICES_PER_ROW, BITS, HAS_ZEROS, S_PAD, Z_PAD, WG, BN, act, mma_layout, a_layout,
                            words_layout, LOOKUP)),
             (_ws_produce, (w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, empty, n_iter,
                            blk0, tile_n, m0, n0, sub_group, STAGES, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD))],
            [1], [24])[0]
    elif IN_FLIGHT and LATE:
        # Two blocks per trip, each product apart: the second block is dequantized while the
        # first one multiplies, the first is folded into acc while the second multiplies.
        # Every group is retired by the trip's end: ptxas tracks a wgmma's accumulator only
        # within the loop body, and a fold reading one issued in the previous trip would
        # make it serialize every wgmma (C7514).
        for j in range(0, n_iter, 2):
            acc = _late_pair(acc, ones, j, w_smem, x_smem, s_smem, z_smem, bar, STAGES, PAIRS, BITS, HAS_ZEROS,
                             S_PAD, Z_PAD, WG, BN, BM, act, mma_layout, words_layout)
            gl.thread_barrier()  # every warp has read both stages: hand them back to TMA
            for u in gl.static_range(2):
                if j + u + STAGES < n_iter:
                    _issue(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, (j + u) % STAGES,
                           blk0 + j + u + STAGES, tile_n, m0, n0, sub_group, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD,
                           Z_PAD)
    elif IN_FLIGHT:
        acc = _in_flight(acc, w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, n_iter, blk0,
                         tile_n, m0, n0, sub_group, STAGES, PAIRS, ROWS, SLICES_PER_ROW, BITS, HAS_ZEROS, S_PAD,
                         Z_PAD, WG, BN, BK, act, mma_layout, a_layout, words_layout, LOOKUP)
    else:
        for j in range(0, n_iter, PER_WAIT):
            for u in gl.static_range(PER_WAIT):
                acc = _block(acc, j + u, w_smem, x_smem, s_smem, z_smem, bar, STAGES, PAIRS, ROWS, SLICES_PER_ROW,
                             BITS, HAS_ZEROS, S_PAD, Z_PAD, WG, BN, act, mma_layout, a_layout, words_layout, LOOKUP)
            # Every group is done before the stages go back; the second block of a pair is
            # dequantized while the first one's groups run.
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            gl.thread_barrier()  # every warp has read these stages: hand them back to TMA
            for u in gl.static_range(PER_WAIT):
                nxt = j + u + STAGES
                if nxt < n_iter:
                    _issue(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, nxt % STAGES,
                           blk0 + nxt, tile_n, m0, n0, sub_group, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD)
    for st in gl.static_range(STAGES):
        mbarrier.invalidate(bar.index(st))
        if WS:
            mbarrier.invalidate(empty.index(st))
    if PDL != 0:
        let_dependents_launch()  # the next layer's launch may start its weight loads
    if ROTATED:  # every load of x has landed and been read: the workspace is free for the next launch
        arrive_rotated(sync_ptr, gl.num_programs(0) * split_k)
    if not STREAM:  # a balanced grid stored each run of its tiles as it ended
        tile_store(acc, pid, pid_k, n0, m0, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, split_k, SPLIT,
                    HAS_BIAS, BN, BM, NUM_WARPS, GATED)
