"""The ``mma.sync`` decode kernel (M ≤ 8) over the shipped ``PassData`` layout: the looked-up
weight is the A operand of ``mma.sync.m16n8k16`` straight from registers, every pass one
GEMV of depth P·K over x rotated before the launch (``x_rot [M, G, P, d]``, block
``b = g·P + p`` is pass p's group g, d = 128).

**Loads.** Lane ``(q, c) = (lane / 4, lane % 4)`` of warp w reads, per block, the 16
contiguous bytes at byte ``16c`` of the group of rows ``16w + q`` and ``16w + q + 8`` of its
tile (``indices [N, K/2]`` as stored: four lanes read one row's 64 group bytes). Its 32-bit
word j (j < 4) is that row's A-fragment register j of the block — the reshape to the operand
moves no data — and byte ``s`` of the word, one stored byte, is a key of the pair table.

**The permutation.** ``Σ_k A[r, k]·B[k, m]`` does not change when the same permutation of k
is applied to A and to x. Slice s (32 k-slots) of a block at k-slot ``8j + 2c + b`` holds
byte ``16c + 4j + s`` of the group, i.e. coordinate :func:`slot_coordinate` ``= 32c + 8j +
2s + b``; x is staged into shared memory in that order once per program, so the weight is
read as stored, never repacked.

**Lookup.** A 256-entry table of centroid pairs ``(c[e & 15], c[e >> 4])`` rounded to the
activation dtype (one 32-bit word: exactly an A register), ``COPIES`` copies an entry in
static shared memory, lane l reading copy ``l mod COPIES`` (32: every lane its own bank).
Per pair of weights one shift, one LOP3 and one ``LDS``.

**Split-K.** ``split`` programs share a row tile's blocks; each stores its fp32 part to a
workspace slot and the tile's last program (an int32 counter per program column, back to 0
when it is done) sums the parts in slot order (``quantcore/triton/gluon_split_k.tile_store``):
the same bits call to call. ``TILES`` 64-row tiles a program share the table and staged x.
With two passes the run of each program is even, so its first register set always holds
pass 0's blocks and its second pass 1's.

**Options** (compile-time, off by default: the shipped kernel). ``WIDE``: a step is two
consecutive groups of one pass (unit ``u = g2·P + p``: groups ``2·g2`` and ``2·g2 + 1``), lane
c loading 16 bytes at ``16c`` and at ``64 + 16c`` of each of its rows, so each step reads
every row's whole 128-byte line (two loads issued together, each the default's load: the
operand conversion stays trivial); each group scaled by its own scale; an odd G's last unit
reads its last group twice with x zero for the second. ``XVEC``: x staged with 16-byte loads
— a thread loads ``32c + 8j + [0, 8)`` for c < 4 of one row and one j, which is every
slice's k-slots ``8j…8j + 7``, so the permutation is a reshape of its registers and each
slice one 16-byte shared store (:func:`staged_slot_coordinate`). sm_90a: both compile
without spills, but ``WIDE`` holds two steps of 16 words in flight (100–133 registers where
the default takes 62–72: two programs an SM at two tiles instead of three or four).

**Measured** (one H200, ``tools/probes/turboquant_mma_decode.py``): right and bit-identical,
but slower than the same walk over a repacked copy (each tile's block in one 4 KB run) by
1.07–2.0×, and than the shipped decode path on the large layers; it is not a default path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from quantcore.transforms.turboquant_passes import PassData
from quantcore.triton.gluon_split_k import tile_store

__all__ = ["BK", "MAX_ROWS", "compile_report", "counters_size", "decode_grid", "emulate", "launch_constants", "mma_decode",
           "slot_coordinate", "staged_slot_coordinate", "wide_slot_codes", "wide_units", "workspace_size"]

#: Coordinates of a block (one TurboQuant group, d = 128).
BK = 128
#: Activation rows the kernel takes (the MMA's N).
MAX_ROWS = 8
#: Rows of a tile (four warps of m16).
TILE_N = 64
#: The table's PTX name (function-scope static shared memory).
_TABLE = "qc_tq_mma_decode_pairs"
#: The same numbers for the kernels.
_BKC = gl.constexpr(BK)
_ROWS = gl.constexpr(MAX_ROWS)
_TN = gl.constexpr(TILE_N)


def _fill_asm(copies: int, fp16: bool) -> str:
    """Declare the pair table and fill it in two rounds of the block's threads (at least
    128): thread t writes entries t and t + threads, each ``copies`` words of
    ``(c[e & 15], c[e >> 4])`` rounded to the activation dtype."""
    cvt = "cvt.rn.f16x2.f32" if fp16 else "cvt.rn.bf16x2.f32"
    stride = 4 * copies
    stores = "".join(f" @p st.shared.v4.b32 [s+{16 * i}], {{v, v, v, v}};" for i in range(copies // 4))
    one = (" setp.lt.u32 p, e, 256; and.b32 lo, e, 15; shr.u32 hi, e, 4; and.b32 hi, hi, 15;"
           " mad.wide.u32 a, lo, 4, $1; @p ld.global.nc.f32 fl, [a];"
           " mad.wide.u32 a, hi, 4, $1; @p ld.global.nc.f32 fh, [a];"
           f" {cvt} v, fh, fl; mov.u32 s, {_TABLE}; mad.lo.u32 s, e, {stride}, s;" + stores + " add.u32 e, e, n;")
    return (f".shared .align 1024 .b8 {_TABLE}[{256 * stride}];\n"
            "{ .reg .pred p; .reg .u32 e, n, lo, hi, s; .reg .u64 a; .reg .f32 fl, fh; .reg .b32 v;"
            " mov.u32 e, %tid.x; mov.u32 n, %ntid.x;" + one + one + " mov.u32 $0, 0; }")


def _lookup_asm(sl: int, copies: int) -> str:
    """One 32-bit word of stored bytes and the lane's copy offset (``$2``) → the centroid
    pair of byte ``sl`` (``$0``): the byte moved to the entry's offset, masked, the copy's
    offset OR-ed in, one shared load."""
    bits = 6 if copies == 16 else 7  # log2 of the entry's bytes (4 × copies)
    shift = 8 * sl - bits
    src = f"shl.b32 t, $1, {-shift};" if shift < 0 else f"shr.u32 t, $1, {shift};"
    mask = 255 << bits
    return ("{ .reg .b32 t, b; " + src + f" and.b32 t, t, {mask:#x}; or.b32 t, t, $2; mov.u32 b, {_TABLE};"
            " add.u32 t, t, b; ld.shared.b32 $0, [t]; }")


#: ``(copies == 32)·2 + fp16``.
_FILL = gl.constexpr(tuple(_fill_asm(c, f) for c in (16, 32) for f in (False, True)))
#: ``(copies == 32)·4 + slice``.
_LOOKUP = gl.constexpr(tuple(_lookup_asm(s, c) for c in (16, 32) for s in range(4)))


@gluon.constexpr_function
def _mma_layout(tiles):
    # Warp 4·t + w: rows 16w… of tile t (row 64·t + r of the stacked operand).
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[4 * tiles, 1], instr_shape=[16, 8])


@gluon.constexpr_function
def _words_layout(tiles):
    # [TILES, 8, 256] int16, a block of each tile: entry (t, 4h + w, 32q + 8c + 2j + b) is
    # int16 2j + b of lane 4q + c's 16 bytes of row 16w + 8h + q; a thread's 8 are contiguous.
    return gl.BlockedLayout([1, 1, 8], [1, 1, 32], [tiles, 4, 1], [2, 1, 0])


@gluon.jit
def _as_operand(words, TILES: gl.constexpr, a_layout: gl.constexpr):
    """A block's words as the A operand's registers ``[64·TILES, 32]`` (row 64t + 16w + 8h +
    q, k-slot 8j + 2c + b): a reshape and permute that move no data."""
    w7 = gl.reshape(words, [TILES, 2, 4, 8, 4, 4, 2])  # (t, h, w, q, c, j, b)
    w7 = gl.permute(w7, [0, 2, 1, 3, 5, 4, 6])  # (t, w, h, q, j, c, b)
    return gl.convert_layout(gl.reshape(w7, [TILES * 64, 32]), a_layout, assert_trivial=True)


@gluon.jit
def _lane_offsets(TILES: gl.constexpr, COPIES: gl.constexpr, a_layout: gl.constexpr):
    """``[64·TILES, 32]`` int16 in the A layout: at each even k-slot the byte offset of the
    holding lane's table copy, 0 at odd ones, so each packed register is that offset."""
    rows = gl.arange(0, TILES * 64, layout=gl.SliceLayout(1, a_layout))
    ks = gl.arange(0, 32, layout=gl.SliceLayout(0, a_layout))
    # m16n8k16's A fragment: lane 4·(row mod 8) + (k mod 8) / 2.
    lane = gl.expand_dims((rows % 8) * 4, 1) + gl.expand_dims((ks % 8) // 2, 0)
    even = gl.expand_dims(ks % 2 == 0, 0)
    off = gl.where(even, (lane % COPIES) * 4, gl.zeros_like(lane))
    return off.to(gl.int16)


@gluon.jit
def _block(acc, words, s0, b, x_smem, lane16, TILES: gl.constexpr, COPIES: gl.constexpr, act: gl.constexpr,
           mma_layout: gl.constexpr, a_layout: gl.constexpr, b_layout: gl.constexpr):
    """Step ``b``: every tile's block looked up slice by slice into the A registers,
    multiplied by x's (permuted) slice from shared memory; the block's product scaled into
    ``acc``."""
    w16 = _as_operand(words, TILES, a_layout)
    return looked_up_product(acc, w16, s0, b, x_smem, lane16, TILES * 64, _ROWS, COPIES, act, mma_layout, b_layout)


@gluon.jit
def looked_up_product(acc, w16, s0, b, x_smem, lane16, ROWS: gl.constexpr, COLS: gl.constexpr,
                      COPIES: gl.constexpr, act: gl.constexpr, mma_layout: gl.constexpr, b_layout: gl.constexpr):
    """A block's pair bytes ``w16`` (already in the A layout) looked up slice by slice into
    the A registers, multiplied by staged x slice ``4b + sl``; the product scaled by the
    rows' ``s0`` into ``acc`` (``[ROWS, COLS]``). Shared with the probe's repacked-layout kernel."""
    part = gl.zeros([ROWS, COLS], gl.float32, mma_layout)
    for sl in gl.static_range(4):
        a = gl.inline_asm_elementwise(_LOOKUP[(COPIES == 32) * 4 + sl], "=r,r,r", [w16, lane16], dtype=act.value,
                                      is_pure=True, pack=2)
        xb = x_smem.index(b * 4 + sl).permute((1, 0)).load(b_layout)
        part = mma_v2(a, xb, part)
    return acc + gl.expand_dims(s0, 1) * part


@gluon.jit
def _wide_block(acc, lo, hi, s_lo, s_hi, b, x_smem, lane16, TILES: gl.constexpr, COPIES: gl.constexpr,
                act: gl.constexpr, mma_layout: gl.constexpr, a_layout: gl.constexpr, b_layout: gl.constexpr):
    """Wide step ``b``: its two groups (x's staged groups ``2b`` and ``2b + 1``), each looked
    up, multiplied and scaled by its own scale as :func:`_block` does."""
    acc = _block(acc, lo, s_lo, 2 * b, x_smem, lane16, TILES, COPIES, act, mma_layout, a_layout, b_layout)
    return _block(acc, hi, s_hi, 2 * b + 1, x_smem, lane16, TILES, COPIES, act, mma_layout, a_layout, b_layout)


@gluon.jit
def _wide_fetch(i_ptr, s_ptr, w_rows, w_cols, s_rows, first, b, G, P: gl.constexpr):
    """Wide step ``b`` (unit ``u = first + b``: groups ``2·(u / P)`` and the next of pass
    ``u mod P``): each row's 128-byte pair of groups, lane c's 16 bytes at ``16c`` and at
    ``64 + 16c`` (two loads issued together, each as :func:`_fetch`'s), and both groups'
    scales; a group past the weight's end reads its pass's last (x is zero there)."""
    g0 = gl.minimum(2 * ((first + b) // P), G - 1)
    g1 = gl.minimum(2 * ((first + b) // P) + 1, G - 1)
    base = i_ptr + w_rows + w_cols
    lo = gl.load(base + g0 * (_BKC // 4), eviction_policy="evict_first")
    hi = gl.load(base + g1 * (_BKC // 4), eviction_policy="evict_first")
    return lo, hi, gl.load(s_ptr + s_rows + g0), gl.load(s_ptr + s_rows + g1)


@gluon.jit
def _fetch(i_ptr, s_ptr, w_rows, w_cols, s_rows, first, b, G, P: gl.constexpr):
    """Step ``b``'s stored bytes (as int16) of every tile and the scale of each accumulator
    row; a block past the weight's end reads its pass's last group (x is zero there)."""
    gi = gl.minimum((first + b) // P, G - 1)
    words = gl.load(i_ptr + w_rows + gi * (_BKC // 4) + w_cols, eviction_policy="evict_first")
    return words, gl.load(s_ptr + s_rows + gi)


@gluon.jit
def _staged_block(i, first, G, P: gl.constexpr, WIDE: gl.constexpr):
    """Group ``i`` of the program's staging → ``(block of x_rot, whether it is inside the
    weight)``: block ``first + i``, or with ``WIDE`` group ``2·(u / P) + i mod 2`` of pass
    ``u mod P`` for unit ``u = first + i / 2`` (block ``g·P + p``)."""
    if WIDE:
        u = first + i // 2
        g = 2 * (u // P) + i % 2
        return g * P + u % P, g < G
    else:
        return first + i, first + i < P * G


@gluon.jit
def _stage_x(x_ptr, x_smem, M, G, stride_xm, first, P: gl.constexpr, TILES: gl.constexpr, NG: gl.constexpr,
             EVEN_K: gl.constexpr, WIDE: gl.constexpr):
    """x of the program's ``NG`` staged groups into shared memory ``[NG·4, 8, 32]``: entry
    ``(4·i + s, m, 8j + 2c + v)`` is coordinate ``32c + 8j + 2s + v`` of staged group i
    (:func:`_staged_block`) of row m (zero past M and the end): the k-slot order of the A
    operand, read with 4-byte gathers."""
    layout: gl.constexpr = gl.BlockedLayout([1, 1, 8 // TILES], [1, 8, 4], [4, 1, TILES], [2, 1, 0])
    sl = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
    mr = gl.arange(0, _ROWS, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    k = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    coord = 32 * ((k % 8) // 2) + 8 * (k // 8) + (k % 2)
    kk = gl.expand_dims(gl.expand_dims(sl * 2, 1), 2) + gl.expand_dims(gl.expand_dims(coord, 0), 1)
    mm = gl.expand_dims(gl.expand_dims(mr, 0), 2)
    offs = mm.to(gl.int64) * stride_xm + kk
    # The same bytes seen as [NG, 4·8, 32]: the 64-byte swizzle repeats every 8 rows.
    view = x_smem._reinterpret(x_smem.dtype, [NG, 4 * _ROWS, 32], x_smem.layout)
    for i in gl.static_range(NG):
        blk, ok = _staged_block(i, first, G, P, WIDE)
        mask = mm < M
        if not EVEN_K:
            mask = mask & ok
        x = gl.load(x_ptr + blk * _BKC + offs, mask=mask, other=0.0)
        view.index(i).store(gl.reshape(x, [4 * _ROWS, 32]))


@gluon.jit
def _stage_x_vec(x_ptr, x_smem, M, G, stride_xm, first, P: gl.constexpr, WARPS: gl.constexpr, NG: gl.constexpr,
                 NCH: gl.constexpr, EVEN_K: gl.constexpr, WIDE: gl.constexpr):
    """As :func:`_stage_x` with 16-byte loads and stores: a thread of the warp that stages a
    group loads the four 16-byte runs ``32c + 8j + [0, 8)`` (c < 4) of one row m and one j,
    i.e. every slice's k-slots ``8j…8j + 7``; the permutation is a reshape of its registers
    and each slice's eight are one 16-byte store. ``NCH`` groups a round (one a warp, the
    other warps repeating them: the same values to the same place)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 1, 4, 1, 8], [1, 8, 1, 4, 1], [WARPS, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    l_i: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, layout))))
    l_m: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, gl.SliceLayout(4, layout))))
    l_c: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, gl.SliceLayout(4, layout))))
    l_j: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(4, layout))))
    l_r: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, layout))))
    ii = gl.arange(0, NCH, layout=l_i)
    mr = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.arange(0, _ROWS, layout=l_m), 0), 2), 3), 4)
    cc = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=l_c), 0), 1), 3), 4)
    jj = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=l_j), 0), 1), 2), 4)
    rr = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.arange(0, 8, layout=l_r), 0), 1), 2), 3)
    offs = mr * stride_xm + (32 * cc + 8 * jj + rr)  # M ≤ 8 rows of P·K: int32
    # The same bytes seen as [NG, 4·8, 32] (the 64-byte swizzle of the last two dims).
    view = x_smem._reinterpret(x_smem.dtype, [NG, 4 * _ROWS, 32],
                               gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=3))
    for i0 in gl.static_range(0, NG, NCH):
        blk, ok = _staged_block(i0 + ii, first, G, P, WIDE)
        blk5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(blk, 1), 2), 3), 4)
        mask = mr < M
        if not EVEN_K:
            mask = mask & gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(ok, 1), 2), 3), 4)
        x = gl.load(x_ptr + blk5 * _BKC + offs, mask=mask, other=0.0)  # [NCH, m, c, j, 2s + v]
        x = gl.permute(gl.reshape(x, [NCH, _ROWS, 4, 4, 4, 2]), [0, 4, 1, 3, 2, 5])  # (i, s, m, j, c, v)
        view.slice(i0, NCH).store(gl.reshape(x, [NCH, 4 * _ROWS, 32]))


@gluon.constexpr_function
def _chunk(groups, warps):
    # Groups a round of the 16-byte staging: the largest power of two dividing both.
    n = 1
    while n < warps and groups % (2 * n) == 0:
        n *= 2
    return n


@gluon.jit
def mma_decode_kernel(
    x_ptr, i0_ptr, i1_ptr, s0_ptr, s1_ptr, cb_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, KK, G, stride_xm, stride_ym, split_k,
    P: gl.constexpr, HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr, EVEN_K: gl.constexpr, STEPS: gl.constexpr,
    COPIES: gl.constexpr, TILES: gl.constexpr, WIDE: gl.constexpr = False, XVEC: gl.constexpr = False,
):
    """``x_ptr``: x_rot ``[M, KK]`` (KK = P·K; row stride ``stride_xm``); ``i{p}_ptr``: pass
    p's stored indices ``[N, K/2]`` read as int16; ``s{p}_ptr``: its fp32 scales ``[N, G]``;
    ``cb_ptr``: the fp32 codebook (16). Grid ``(ceil(N / (64·TILES)), split)``: program
    ``(c, k)`` of ``4·TILES`` warps walks ``STEPS`` steps from ``k·STEPS`` of its tiles,
    two steps in flight. A step is one block, or with ``WIDE`` one unit ``u = g2·P + p``:
    groups ``2·g2`` and ``2·g2 + 1`` of pass p (each row's whole 128-byte line; the last
    unit of an odd G has x zero for its second group). ``XVEC``: x staged with 16-byte loads
    (:func:`_stage_x_vec`)."""
    gl.static_assert(P == 1 or STEPS % 2 == 0, "two passes walk an even run")
    act: gl.constexpr = x_ptr.dtype.element_ty
    FP16: gl.constexpr = act == gl.float16
    mma_layout: gl.constexpr = _mma_layout(TILES)
    a_layout: gl.constexpr = gl.DotOperandLayout(0, mma_layout, 2)
    b_layout: gl.constexpr = gl.DotOperandLayout(1, mma_layout, 2)
    words_layout: gl.constexpr = _words_layout(TILES)
    NG: gl.constexpr = STEPS * 2 if WIDE else STEPS

    cta = gl.program_id(0)
    pid_k = gl.program_id(1)
    n0 = cta * (_TN * TILES)
    first = pid_k * STEPS
    row_words = G * (_BKC // 4)  # int16 of a stored row

    t_w = gl.arange(0, TILES, layout=gl.SliceLayout(1, gl.SliceLayout(2, words_layout)))
    r_w = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, words_layout)))
    c_w = gl.arange(0, 256, layout=gl.SliceLayout(0, gl.SliceLayout(1, words_layout)))
    # Row 64t + 16w + 8h + q of the tile (dim 1 = 4h + w, column 32q + ...), the last row past N.
    rows = (gl.expand_dims(gl.expand_dims(t_w * 64, 1), 2) + gl.expand_dims(gl.expand_dims((r_w % 4) * 16
            + (r_w // 4) * 8, 0), 2) + gl.expand_dims(gl.expand_dims(c_w // 32, 0), 1))
    w_rows = gl.minimum(n0 + rows, N - 1) * row_words
    w_cols = gl.expand_dims(gl.expand_dims(c_w % 32, 0), 1)
    rows_c = gl.arange(0, TILES * 64, layout=gl.SliceLayout(1, mma_layout))
    s_rows = gl.minimum(n0 + rows_c, N - 1) * G

    ib_ptr = i1_ptr if P == 2 else i0_ptr
    sb_ptr = s1_ptr if P == 2 else s0_ptr
    if WIDE:
        w_a, v_a, sa, ta = _wide_fetch(i0_ptr, s0_ptr, w_rows, w_cols, s_rows, first, 0, G, P)
        w_b, v_b, sb, tb = _wide_fetch(ib_ptr, sb_ptr, w_rows, w_cols, s_rows, first, 1, G, P)
    else:
        w_a, sa = _fetch(i0_ptr, s0_ptr, w_rows, w_cols, s_rows, first, 0, G, P)
        w_b, sb = _fetch(ib_ptr, sb_ptr, w_rows, w_cols, s_rows, first, 1, G, P)
    gl.inline_asm_elementwise(_FILL[(COPIES == 32) * 2 + FP16], "=r,l", [cb_ptr], dtype=gl.int32, is_pure=False,
                              pack=1)
    lane16 = _lane_offsets(TILES, COPIES, a_layout)
    x_smem = gl.allocate_shared_memory(act, [NG * 4, _ROWS, 32],
                                       gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2))
    if XVEC:
        _stage_x_vec(x_ptr, x_smem, M, G, stride_xm, first, P, 4 * TILES, NG, _chunk(NG, 4 * TILES), EVEN_K, WIDE)
    else:
        _stage_x(x_ptr, x_smem, M, G, stride_xm, first, P, TILES, NG, EVEN_K, WIDE)
    gl.thread_barrier()  # x staged and the table filled
    acc = gl.zeros([TILES * 64, _ROWS], gl.float32, mma_layout)
    if WIDE:
        # The same bound, unknown to the compiler (STEPS ≤ max(2, P·G)): the walk stays a loop
        # rather than every step's loads hoisted at once.
        for b in range(0, gl.minimum(STEPS, 2 * P * G + 2), 2):
            acc = _wide_block(acc, w_a, v_a, sa, ta, b, x_smem, lane16, TILES, COPIES, act, mma_layout, a_layout,
                              b_layout)
            w_a, v_a, sa, ta = _wide_fetch(i0_ptr, s0_ptr, w_rows, w_cols, s_rows, first,
                                           gl.minimum(b + 2, STEPS - 2 + (P == 1)), G, P)
            if b + 1 < STEPS:
                acc = _wide_block(acc, w_b, v_b, sb, tb, b + 1, x_smem, lane16, TILES, COPIES, act, mma_layout,
                                  a_layout, b_layout)
            w_b, v_b, sb, tb = _wide_fetch(ib_ptr, sb_ptr, w_rows, w_cols, s_rows, first,
                                           gl.minimum(b + 3, STEPS - 1), G, P)
    else:
        for b in range(0, STEPS, 2):
            acc = _block(acc, w_a, sa, b, x_smem, lane16, TILES, COPIES, act, mma_layout, a_layout, b_layout)
            w_a, sa = _fetch(i0_ptr, s0_ptr, w_rows, w_cols, s_rows, first, gl.minimum(b + 2, STEPS - 2 + (P == 1)),
                             G, P)
            if b + 1 < STEPS:
                acc = _block(acc, w_b, sb, b + 1, x_smem, lane16, TILES, COPIES, act, mma_layout, a_layout, b_layout)
            w_b, sb = _fetch(ib_ptr, sb_ptr, w_rows, w_cols, s_rows, first, gl.minimum(b + 3, STEPS - 1), G, P)
    tile_store(acc, cta, pid_k, n0, 0, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, split_k, SPLIT, HAS_BIAS,
               _TN * TILES, _ROWS, 4 * TILES)


# --- host side -------------------------------------------------------------------------------


def slot_coordinate() -> torch.Tensor:
    """int64 ``[4, 32]``: the coordinate of a block that k-slot ``k`` of slice ``s`` holds
    (``32c + 8j + 2s + b`` for ``k = 8j + 2c + b``); a permutation of 0…127."""
    k = torch.arange(32)
    s = torch.arange(4).unsqueeze(1)
    return 32 * ((k % 8) // 2) + 8 * (k // 8) + 2 * s + (k % 2)


def slot_codes(indices: torch.Tensor, group: int) -> torch.Tensor:
    """int64 ``[N, 4, 32]``: the code each k-slot of each slice of ``group`` looks up, read
    as the kernel reads the stored bytes (lane c's 16 bytes at ``16c``, word j, byte s; the
    low nibble at even k-slots)."""
    n = indices.shape[0]
    grp = indices[:, group * (BK // 2):(group + 1) * (BK // 2)].to(torch.int64)  # [N, 64]
    k = torch.arange(32)
    byte = 16 * ((k % 8) // 2) + 4 * (k // 8) + torch.arange(4).unsqueeze(1)  # [4, 32]
    b = grp[:, byte.reshape(-1)].view(n, 4, 32)
    return torch.where((k % 2 == 0), b & 15, b >> 4)


def staged_slot_coordinate() -> torch.Tensor:
    """int64 ``[4, 32]``: the coordinate :func:`_stage_x_vec` puts at k-slot k of slice s: a
    thread's four 16-byte runs ``32c + 8j + [0, 8)`` seen as ``(c, j, s, v)`` and reshaped to
    ``(s, j, c, v)`` (equal to :func:`slot_coordinate`)."""
    return torch.arange(BK).view(4, 4, 4, 2).permute(2, 1, 0, 3).reshape(4, 32)


def wide_slot_codes(indices: torch.Tensor, unit: int, passes: int = 1) -> torch.Tensor:
    """int64 ``[N, 2, 4, 32]``: the codes of wide step ``unit``'s two groups (``2·(unit /
    P)`` and the next; a group past the end reads the last group, as the kernel does), read
    from each row's 128-byte line as the kernel reads it (lane c's 16 bytes at ``64u +
    16c``, word j, byte s)."""
    n, half = indices.shape
    groups = 2 * half // BK
    g0 = 2 * (unit // passes)
    out = []
    for u in range(2):
        g = min(g0 + u, groups - 1)
        line = indices[:, g * (BK // 2):(g + 1) * (BK // 2)].to(torch.int64)
        k = torch.arange(32)
        byte = 16 * ((k % 8) // 2) + 4 * (k // 8) + torch.arange(4).unsqueeze(1)
        b = line[:, byte.reshape(-1)].view(n, 4, 32)
        out.append(torch.where((k % 2 == 0), b & 15, b >> 4))
    return torch.stack(out, 1)


def emulate(x_rot: torch.Tensor, passes: Sequence[PassData], codebook: torch.Tensor, bias: torch.Tensor | None,
            out_dtype: torch.dtype, *, wide: bool = False, xvec: bool = False) -> torch.Tensor:
    """The kernel's arithmetic in torch (any device): x staged in k-slot order (with
    ``xvec`` by :func:`staged_slot_coordinate`), each k-slot's code read as the kernel reads
    the stored bytes (with ``wide`` a step's two groups from the row's 128-byte line,
    :func:`wide_slot_codes`, the second group of an odd count's last step weighted by zero),
    centroids rounded to x's dtype, each group's product in fp32 scaled once, the sum
    rounded to ``out_dtype``."""
    m, kk = x_rot.shape
    p = len(passes)
    n = passes[0].indices.shape[0]
    groups = kk // (p * BK)
    cb = codebook.to(x_rot.dtype).float().cpu()
    order = staged_slot_coordinate() if xvec else slot_coordinate()
    xb = x_rot.float().cpu().view(m, groups, p, BK)[..., order.reshape(-1)]  # [M, G, P, 128]
    y = torch.zeros(m, n, dtype=torch.float32)
    if wide:
        for unit in range(p * -(-groups // 2)):
            q, data = unit % p, passes[unit % p]
            codes = wide_slot_codes(data.indices.cpu(), unit, p)
            for u in range(2):
                g = 2 * (unit // p) + u
                xg = xb[:, g, q] if g < groups else torch.zeros(m, BK)
                part = xg @ cb[codes[:, u].reshape(n, BK)].T
                y += part * data.scales[:, min(g, groups - 1)].float().cpu()
    else:
        for g in range(groups):
            for q, data in enumerate(passes):
                wq = cb[slot_codes(data.indices.cpu(), g).reshape(n, BK)]
                part = xb[:, g, q] @ wq.T
                y += part * data.scales[:, g].float().cpu()
    if bias is not None:
        y += bias.float().cpu()
    return y.to(out_dtype).to(x_rot.device)


def wide_units(groups: int, passes: int) -> int:
    """Steps of ``wide`` over the weight: each pass's groups in pairs (an odd count's last
    pair half past the end), unit ``g2·P + p``."""
    return passes * -(-groups // 2)


def decode_grid(blocks: int, split: int, passes: int) -> tuple[int, int]:
    """``(steps, split)``: ``split`` programs cut a tile's ``blocks`` into runs of ``steps``,
    at least two and even with two passes (each register set one pass); the last run may
    pass the end, no program is empty."""
    steps = max(2, -(-blocks // max(1, split)))
    steps += steps % 2 if passes == 2 else 0
    return steps, -(-blocks // steps)


def workspace_size(m: int, n: int, split: int) -> int:
    """fp32 elements of the split-K workspace a call of ``m`` rows and ``split`` needs."""
    return split * m * n if split > 1 else 0


def counters_size(n: int, tiles: int) -> int:
    """int32 counters a layer of ``n`` rows needs at ``tiles`` row tiles a program (zero
    before the first launch; every launch leaves them zero)."""
    return -(-n // (TILE_N * tiles))


_opted: set[tuple[Any, ...]] = set()


def launch_constants(passes: int, groups: int, split: int, *, tiles: int, copies: int, has_bias: bool,
                     wide: bool = False, xvec: bool = False) -> tuple[int, dict[str, Any]]:
    """``(split, constexprs)`` of a launch over ``passes`` passes of ``groups`` groups: the
    split rounded to whole runs (:func:`decode_grid`) and the kernel's compile-time arguments."""
    units = wide_units(groups, passes) if wide else passes * groups
    steps, split = decode_grid(units, split, passes)
    if xvec and steps & (steps - 1):
        # Its staging reshapes x's registers by the run's length: a power of two only (an
        # odd run aborts Triton's layout pass instead of compiling).
        raise ValueError(f"mma_decode: xvec stages runs of a power of two steps, this split gives {steps}")
    return split, dict(P=passes, HAS_BIAS=has_bias, SPLIT=split > 1,
                       EVEN_K=units % steps == 0 and not (wide and groups % 2), STEPS=steps, COPIES=copies,
                       TILES=tiles, WIDE=bool(wide), XVEC=bool(xvec))


def mma_decode(x_rot: torch.Tensor, passes: Sequence[PassData], codebook: torch.Tensor, bias: torch.Tensor | None,
               out: torch.Tensor, *, split: int, tiles: int = 2, copies: int = 32,
               workspace: torch.Tensor | None = None, counters: torch.Tensor | None = None, wide: bool = False,
               xvec: bool = False) -> torch.Tensor:
    """``out [M, N] = x_rot·Ŵᵀ (+ bias)`` in one launch, Ŵ the passes' stored indices and
    scales as prepared (d = 128, no copy). ``x_rot``: ``[M, P·K]`` (M ≤ 8, row-contiguous,
    ``[M, G, P, d]`` in memory: every pass's rotation applied); ``codebook`` fp32 [16];
    ``bias`` [N] or None; ``out`` ``[M, N]`` in the activation dtype (its row stride free).
    ``split`` programs share a row tile's K (the run is rounded, :func:`decode_grid`); with
    ``split`` above 1 the run needs ``workspace`` (fp32, at least :func:`workspace_size`) and
    ``counters`` (int32, at least :func:`counters_size`, zero; left zero). ``wide``: a step
    reads two groups of a pass (each row's 128-byte line; ``split`` cuts :func:`wide_units`);
    ``xvec``: x staged with 16-byte loads. Both off: the shipped kernel."""
    p = len(passes)
    m, kk = x_rot.shape
    n, half = passes[0].indices.shape
    if p not in (1, 2) or tiles not in (1, 2) or copies not in (16, 32):
        raise ValueError(f"mma_decode: passes 1 or 2, tiles 1 or 2, copies 16 or 32; got {p}, {tiles}, {copies}")
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"mma_decode: 1 to {MAX_ROWS} rows, got {m}")
    if x_rot.dtype not in (torch.bfloat16, torch.float16) or out.dtype != x_rot.dtype:
        raise ValueError(f"mma_decode: x_rot and out in bf16 or fp16, got {x_rot.dtype} and {out.dtype}")
    if kk != 2 * half * p or half % (BK // 2) or x_rot.stride(1) != 1:
        raise ValueError(f"mma_decode: x_rot [M, P·K] row-contiguous with K = {2 * half} a multiple of {BK}, "
                         f"got {tuple(x_rot.shape)} strides {x_rot.stride()}")
    if tuple(out.shape) != (m, n) or out.stride(1) != 1:
        raise ValueError(f"mma_decode: out [{m}, {n}] row-contiguous, got {tuple(out.shape)} strides {out.stride()}")
    groups = 2 * half // BK
    for d in passes:
        if (tuple(d.indices.shape) != (n, half) or d.indices.dtype != torch.uint8 or not d.indices.is_contiguous()
                or tuple(d.scales.shape) != (n, groups) or d.scales.dtype != torch.float32
                or not d.scales.is_contiguous()):
            raise ValueError("mma_decode: each pass's indices [N, K/2] uint8 and scales [N, K/128] float32, "
                             "contiguous")
        if d.indices.data_ptr() % 16:
            raise ValueError("mma_decode: indices must be 16-byte aligned")
    if n * half >= 2**31:
        raise ValueError("mma_decode: a pass's indices must hold fewer than 2**31 bytes")
    split, constexprs = launch_constants(p, groups, split, tiles=tiles, copies=copies, has_bias=bias is not None,
                                         wide=wide, xvec=xvec)
    grid = (counters_size(n, tiles), split)
    if split > 1:
        if workspace is None or workspace.dtype != torch.float32 or workspace.numel() < workspace_size(m, n, split):
            raise ValueError(f"mma_decode: split {split} needs an fp32 workspace of {workspace_size(m, n, split)}")
        if counters is None or counters.dtype != torch.int32 or counters.numel() < grid[0]:
            raise ValueError(f"mma_decode: split {split} needs {grid[0]} int32 counters (zero)")
    ws = workspace if workspace is not None else out
    cnt = counters if counters is not None else out
    last = passes[-1]
    args = (x_rot, passes[0].indices.view(torch.int16), last.indices.view(torch.int16), passes[0].scales,
            last.scales, codebook, bias if bias is not None else codebook, out, ws, cnt,
            m, n, kk, groups, x_rot.stride(0), out.stride(0), split)
    const = dict(constexprs, num_warps=4 * tiles)
    # Triton compiles a variant per specialisation of the arguments (an int equal to 1 or
    # divisible by 16, a pointer 16-byte aligned): each needs its own opt-in.
    key = (x_rot.device, tuple(sorted(const.items())),
           tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else (a == 1, a % 16 == 0)
                 for a in args))
    if key not in _opted:
        # The static table beside Triton's shared memory may pass 48 KB: each compiled
        # variant opts in before its first launch.
        from quantcore.triton.static_shared import opt_in

        opt_in(mma_decode_kernel.warmup(*args, grid=grid, **const))
        _opted.add(key)
    mma_decode_kernel[grid](*args, **const)
    return out


def compile_report(*, fp16: bool = False, passes: int = 2, steps: int = 8, copies: int = 32,
                   tiles: int = 2, wide: bool = False, xvec: bool = False,
                   maxnreg: int | None = None) -> dict[str, Any]:
    """Compile for sm_90a on any machine (Triton's bundled ptxas): registers, spill stack,
    shared memory (Triton's and the table), programs an SM, and the walk's opcode counts (two
    steps) per weight a thread handles there."""
    from quantcore.triton.compile_report import (
        backward_loops,
        compile_sm90,
        instructions,
        occupancy_sm90,
        opcode_counts,
        opcodes_in,
    )

    act = "fp16" if fp16 else "bf16"
    sig = {"x_ptr": f"*{act}", "i0_ptr": "*i16", "i1_ptr": "*i16", "s0_ptr": "*fp32", "s1_ptr": "*fp32",
           "cb_ptr": "*fp32", "b_ptr": "*fp32", "y_ptr": f"*{act}", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
           "M": "i32", "N": "i32", "KK": "i32", "G": "i32", "stride_xm": "i32", "stride_ym": "i32", "split_k": "i32"}
    const = dict(P=passes, HAS_BIAS=False, SPLIT=True, EVEN_K=True, STEPS=steps, COPIES=copies, TILES=tiles,
                 WIDE=wide, XVEC=xvec)
    compiled = compile_sm90(mma_decode_kernel, sig, const, divisible=[a for a in sig if a not in ("M", "G")],
                            options={"num_warps": 4 * tiles, **({"maxnreg": maxnreg} if maxnreg else {})}, gluon=True)
    ins = instructions(compiled.sass)
    walk = max(backward_loops(ins), key=lambda span: len(opcodes_in(ins, span)))
    counts = opcode_counts(opcodes_in(ins, walk))
    # Outside the walk (x's staging, the table, the scales, the store): the global loads
    # and shared stores with their width.
    outside = [i.opcode for i in ins if not walk[0] <= i.address <= walk[1]]
    staging = {op: outside.count(op) for op in sorted(set(outside)) if op.startswith(("LDG", "STS"))}
    # A trip: two steps (of one group, or two with ``wide``) of 64 rows × 128 coordinates over a tile's 128 threads.
    weights = 2 * (2 if wide else 1) * TILE_N * BK / 128
    table = 256 * 4 * copies
    return {"fp16": fp16, "passes": passes, "steps": steps, "copies": copies, "tiles": tiles, "wide": wide,
            "xvec": xvec, "maxnreg": maxnreg, "staging": staging,
            "registers": compiled.registers, "spill_stack": compiled.spill_stack, "shared": compiled.shared,
            "table": table, "blocks_per_sm": occupancy_sm90(compiled.registers, 4 * tiles, compiled.shared + table),
            "walk": dict(counts), "per_weight": round(sum(counts.values()) / weights, 2),
            "lds_per_weight": round(counts.get("LDS", 0) / weights, 3),
            "ldg_128": sum(1 for op in opcodes_in(ins, walk) if op.startswith("LDG") and ".128" in op)}
