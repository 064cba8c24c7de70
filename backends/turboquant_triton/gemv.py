"""The decode kernel (M = 1): rotation, unpack, lookup, dot and rescale of every pass in
one launch, split over K so that a decode step fills the GPU.

Grid ``(CHUNKS, SPLIT)``. Program (c, s) owns the row chunk c (``ROWS_CTA`` rows) and the
groups ``[s·GPC, (s+1)·GPC)`` of every pass:

1. it rotates its slice of x once — a [16, d] × [d, d] ``tl.dot`` per pass with the GPC
   groups as rows (shared rotation, R = 1), or loads the pre-rotated slice (R = G, or the
   ``prerotate`` plan: :func:`rotate_kernel` rotated each split's groups once, bit for
   bit the same rows, so the programs skip the dot and the d² rotation reads) —
   and splits it into the eight nibble planes (``lookup.rotated_planes``), held in
   registers for the rest of the program;
2. it walks its rows ``BR`` at a time: loads the index words (16-byte vectors, the next
   step's words in flight while this step computes; with ``HALVES`` each thread's two
   vectors come from the two halves of the row's words, :func:`_word_columns`), looks the 8 nibbles of each word
   up in the shared-memory codebook, multiplies with the plane of x, sums per
   (row, group), applies the group's scale once per (row, group) and sums the groups;
3. with SPLIT > 1 it stores its row partials in a float32 workspace; the program that
   finishes its chunk last (an atomic ticket per chunk) adds the SPLIT partials in split
   order — deterministic — plus ``partial`` and ``bias``, writes the output and resets
   the ticket for the next launch. With SPLIT = 1 it writes the output directly.

Bytes: each index byte is read once; x (M·K) is read CHUNKS times from L2; the rotation
(d² values) once per program from L2.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from quantcore.triton.interpreter import serialize_launches

from .lookup import codebook_table, nibble_values, rotated_planes, to_output
from .pairs import pair_table, pair_values

serialize_launches()  # the interpreter's launches share module state: one at a time

__all__ = ["gemv_kernel", "rotate_kernel"]


@triton.jit
def _rotated16(x_ptr, rot_ptr, g0, ROWS: tl.constexpr, N_GROUPS: tl.constexpr, D: tl.constexpr,
               X_ROTATED: tl.constexpr, DOT_FP32: tl.constexpr, WAIT: tl.constexpr = False):
    """x_rot of groups g0 … g0+ROWS−1 as a [16, d] float32 tile (the other rows zero): one
    ``[16, d] × [d, d]`` dot, or the pre-rotated slice. :func:`rotate_kernel` calls it
    with the same operands, so its rows are bit for bit those of the fused rotation.
    ``WAIT``: the rotation is read, then the grid waits for the kernel before it (which
    wrote x: programmatic dependent launch), then x is read."""
    r16 = tl.arange(0, 16)
    g_of = g0 + r16
    row_ok = (r16 < ROWS) & (g_of < N_GROUPS)
    dd = tl.arange(0, D)
    if not X_ROTATED:
        p = tl.load(rot_ptr + dd[:, None] * D + dd[None, :])
    if WAIT:
        gdc_wait()
    xg = tl.load(x_ptr + g_of[:, None] * D + dd[None, :], mask=row_ok[:, None], other=0.0)
    if X_ROTATED:
        xr16 = xg.to(tl.float32)
    else:
        if DOT_FP32:
            xr16 = tl.dot(xg.to(tl.float32), p.to(tl.float32), input_precision="ieee")
        else:
            xr16 = tl.dot(xg, p)
    return xr16


@triton.jit
def rotate_kernel(x_ptr, rot_ptr, out_ptr, N_GROUPS: tl.constexpr, D: tl.constexpr, GPC: tl.constexpr,
                  DOT_FP32: tl.constexpr):
    """x_rot (float32) of the GPC groups of split s in program s, for the decode kernel's
    ``prerotate`` plan: the rotation once per split instead of once per program of the
    decode kernel, on the very operands that program would use (the same rows and zero
    rows), so its results are the same bits on every device and under the interpreter."""
    g0 = tl.program_id(0) * GPC
    xr16 = _rotated16(x_ptr, rot_ptr, g0, GPC, N_GROUPS, D, False, DOT_FP32)
    r16 = tl.arange(0, 16)
    dd = tl.arange(0, D)
    ok = (r16 < GPC) & (g0 + r16 < N_GROUPS)
    tl.store(out_ptr + (g0 + r16)[:, None] * D + dd[None, :], xr16, mask=ok[:, None])


@triton.jit
def _planes(x_ptr, rot_ptr, g0, K: tl.constexpr, N_GROUPS: tl.constexpr, D: tl.constexpr,
            GPC: tl.constexpr, X_ROTATED: tl.constexpr, DOT_FP32: tl.constexpr, WAIT: tl.constexpr):
    """The eight nibble planes of x_rot for groups g0 … g0+GPC−1: [GPC·d/8] each."""
    xr16 = _rotated16(x_ptr, rot_ptr, g0, GPC, N_GROUPS, D, X_ROTATED, DOT_FP32, WAIT)
    WPG: tl.constexpr = D // 8
    p0, p1, p2, p3, p4, p5, p6, p7 = rotated_planes(xr16, 16, WPG)
    # Rows GPC … 15 are zero: fold them away, then one row of CW = GPC·WPG words.
    CW: tl.constexpr = GPC * WPG
    F: tl.constexpr = 16 // GPC
    p0 = tl.reshape(tl.sum(tl.reshape(p0, [F, CW]), axis=0), [CW])
    p1 = tl.reshape(tl.sum(tl.reshape(p1, [F, CW]), axis=0), [CW])
    p2 = tl.reshape(tl.sum(tl.reshape(p2, [F, CW]), axis=0), [CW])
    p3 = tl.reshape(tl.sum(tl.reshape(p3, [F, CW]), axis=0), [CW])
    p4 = tl.reshape(tl.sum(tl.reshape(p4, [F, CW]), axis=0), [CW])
    p5 = tl.reshape(tl.sum(tl.reshape(p5, [F, CW]), axis=0), [CW])
    p6 = tl.reshape(tl.sum(tl.reshape(p6, [F, CW]), axis=0), [CW])
    p7 = tl.reshape(tl.sum(tl.reshape(p7, [F, CW]), axis=0), [CW])
    return p0, p1, p2, p3, p4, p5, p6, p7


@triton.jit
def _word_columns(cols, CW: tl.constexpr, HALVES: tl.constexpr):
    """The word each column of a [BR, CW] word tile reads: its own, or with ``HALVES``
    column ``c = 8t + 4h + q`` reads word ``h·CW/2 + 4t + q``.

    Where a tile holds 8 words a thread, the compiler may lay them out as 8 consecutive
    columns of one row (at 16 rows × 128 words: the layout of the x tile of the same
    shape): a thread then loads two 16-byte vectors 16 bytes apart, so each warp-wide load
    uses half of every 32-byte sector and each sector is requested twice. With ``HALVES``
    the first vector of every thread lies in the row's first half and the second in its
    second half: each warp-wide load reads whole sectors. Columns ``4v … 4v+3`` stay one
    vector of four consecutive words (one group), so the products are summed as before
    within a vector; the vectors are summed in another order."""
    if HALVES:
        return (cols // 4) % 2 * (CW // 2) + cols // 8 * 4 + cols % 4
    return cols


@triton.jit
def _plane_columns(p, CW: tl.constexpr, HALVES: tl.constexpr):
    """A plane of x ([CW], word order) in the tile's column order (:func:`_word_columns`)."""
    if HALVES:
        return tl.reshape(tl.permute(tl.reshape(p, [2, CW // 8, 4]), (1, 0, 2)), [CW])
    return p


@triton.jit
def _planes_in_columns(x_ptr, rot_ptr, g0, K: tl.constexpr, N_GROUPS: tl.constexpr, D: tl.constexpr,
                       GPC: tl.constexpr, X_ROTATED: tl.constexpr, DOT_FP32: tl.constexpr, WAIT: tl.constexpr,
                       HALVES: tl.constexpr):
    """:func:`_planes` in the word tile's column order."""
    CW: tl.constexpr = GPC * (D // 8)
    p0, p1, p2, p3, p4, p5, p6, p7 = _planes(x_ptr, rot_ptr, g0, K, N_GROUPS, D, GPC, X_ROTATED, DOT_FP32, WAIT)
    return (_plane_columns(p0, CW, HALVES), _plane_columns(p1, CW, HALVES), _plane_columns(p2, CW, HALVES),
            _plane_columns(p3, CW, HALVES), _plane_columns(p4, CW, HALVES), _plane_columns(p5, CW, HALVES),
            _plane_columns(p6, CW, HALVES), _plane_columns(p7, CW, HALVES))


@triton.jit
def _load_words(idx_ptr, rows, rmask, cols, stride_idx, g0, WPG: tl.constexpr,
                N_GROUPS: tl.constexpr, GPC: tl.constexpr):
    ptrs = idx_ptr + rows[:, None].to(tl.int64) * stride_idx + g0 * WPG + cols[None, :]
    if N_GROUPS % GPC == 0:
        mask = rmask[:, None]
    else:  # the last split runs past K: whole groups masked (constant over each vector)
        mask = rmask[:, None] & ((cols // WPG)[None, :] < N_GROUPS - g0)
    w = tl.load(ptrs, mask=mask, other=0, eviction_policy="evict_first")
    return w.to(tl.uint32, bitcast=True)


@triton.jit
def _row_sums(w, x0, x1, x2, x3, x4, x5, x6, x7, s, cb_ptr,
              BR: tl.constexpr, CW: tl.constexpr, LOOKUP: tl.constexpr, INTERPRET: tl.constexpr):
    """Σ_groups scale · Σ_coords c[idx]·x_rot for the BR rows of a word tile: [BR].

    Each 4 columns of the word tile are one 16-byte vector of words of one group, so a
    vector's partial takes its group's scale before the sum across the row (``s`` is
    [BR, CW/4], :func:`_load_scales`). ``LOOKUP``
    other than 0: both nibbles of a byte looked up at once (``pairs.py``)."""
    if LOOKUP != 0:
        v0, v1, v2, v3, v4, v5, v6, v7 = pair_values(w, cb_ptr, LOOKUP, INTERPRET)
    else:
        v0, v1, v2, v3, v4, v5, v6, v7 = nibble_values(w, cb_ptr, INTERPRET)
    acc = v0 * x0[None, :]
    acc += v1 * x1[None, :]
    acc += v2 * x2[None, :]
    acc += v3 * x3[None, :]
    acc += v4 * x4[None, :]
    acc += v5 * x5[None, :]
    acc += v6 * x6[None, :]
    acc += v7 * x7[None, :]
    per_vector = tl.sum(tl.reshape(acc, [BR, CW // 4, 4]), axis=2)
    return tl.sum(per_vector * s, axis=1)


@triton.jit
def _load_scales(scale_ptr, rows, N, g0, N_GROUPS: tl.constexpr, CW: tl.constexpr, WPG: tl.constexpr,
                 INTERPRET: tl.constexpr, HALVES: tl.constexpr):
    """The scale of each 4-word vector's group: [BR, CW/4] (vector ``v`` of the tile
    holds words ``4v …`` of the row, or with ``HALVES`` words ``4·((v % 2)·CW/8 + v // 2) …``:
    :func:`_word_columns`). On the GPU a plain load
    would get a layout of its own (its addresses repeat along the row) and cost a
    shared-memory layout conversion per step; the PTX load takes the layout of its use.
    Addresses are clamped into the tensor instead of masked: rows past N are never
    stored, and groups past K multiply activations that are zero."""
    vec = tl.arange(0, CW // 4)
    if HALVES:
        vec = vec % 2 * (CW // 8) + vec // 2
    vg = g0 + vec // (WPG // 4)
    if INTERPRET:
        mask = (rows < N)[:, None] & (vg < N_GROUPS)[None, :]
        return tl.load(scale_ptr + rows[:, None].to(tl.int64) * N_GROUPS + vg[None, :], mask=mask, other=0.0)
    safe_rows = tl.minimum(rows, N - 1).to(tl.int64)
    safe_vg = tl.minimum(vg, N_GROUPS - 1)
    return tl.inline_asm_elementwise("ld.global.nc.f32 $0, [$1];", "=r,l",
                                     [scale_ptr + safe_rows[:, None] * N_GROUPS + safe_vg[None, :]],
                                     dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _store_partial(ptrs, values, mask, INTERPRET: tl.constexpr):
    """Store the step's row partials from the layout they were reduced in (every replica
    of a row stores the same value to the same address: one coalesced write)."""
    if INTERPRET:
        tl.store(ptrs, values, mask=mask)
    else:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.u32 p, $3, 0; @p st.global.f32 [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r,r", [ptrs.to(tl.int64), values.to(tl.int32, bitcast=True), mask.to(tl.int32)],
            dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _release(INTERPRET: tl.constexpr):
    """Make this thread's workspace stores visible GPU-wide before the ticket is taken."""
    if not INTERPRET:
        tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r,r", [tl.program_id(0)],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def gemv_kernel(
    x_ptr, x2_ptr, idx_ptr, scale_ptr, rot_ptr, idx2_ptr, scale2_ptr, rot2_ptr,
    cb_ptr, out_ptr, partial_ptr, bias_ptr, ws_ptr, ticket_ptr,
    N, stride_idx, stride_idx2,
    N_GROUPS: tl.constexpr, D: tl.constexpr, GPC: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
    ROWS_CTA: tl.constexpr, BR: tl.constexpr, TAIL: tl.constexpr, UNROLL: tl.constexpr, TWO_PASSES: tl.constexpr,
    X_ROTATED: tl.constexpr, HAS_PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    DOT_FP32: tl.constexpr, LOOKUP: tl.constexpr, PDL: tl.constexpr, INTERPRET: tl.constexpr,
    HALVES: tl.constexpr,
):
    if PDL:  # the next kernel's programs may start as this one's finish (programmatic dependent launch)
        gdc_launch_dependents()
    chunk = tl.program_id(0)
    split = tl.program_id(1)
    g0 = split * GPC
    K: tl.constexpr = N_GROUPS * D
    WPG: tl.constexpr = D // 8
    CW: tl.constexpr = GPC * WPG
    STEPS: tl.constexpr = ROWS_CTA // BR
    row0 = chunk * ROWS_CTA
    cols = _word_columns(tl.arange(0, CW), CW, HALVES)
    br = tl.arange(0, BR)

    # Three steps of index words and scales in flight before the rotation's latency; the
    # loop keeps three ahead of the one it computes (one 16-byte vector per thread a step).
    rows = row0 + br
    w = _load_words(idx_ptr, rows, rows < N, cols, stride_idx, g0, WPG, N_GROUPS, GPC)
    w1 = _load_words(idx_ptr, rows + BR, (rows + BR < N) & (STEPS > 1), cols, stride_idx, g0, WPG, N_GROUPS, GPC)
    w2 = _load_words(idx_ptr, rows + 2 * BR, (rows + 2 * BR < N) & (STEPS > 2), cols, stride_idx, g0, WPG,
                     N_GROUPS, GPC)
    s = _load_scales(scale_ptr, rows, N, g0, N_GROUPS, CW, WPG, INTERPRET, HALVES)
    s1 = _load_scales(scale_ptr, rows + BR, N, g0, N_GROUPS, CW, WPG, INTERPRET, HALVES)
    s2 = _load_scales(scale_ptr, rows + 2 * BR, N, g0, N_GROUPS, CW, WPG, INTERPRET, HALVES)
    if TWO_PASSES:
        v = _load_words(idx2_ptr, rows, rows < N, cols, stride_idx2, g0, WPG, N_GROUPS, GPC)
        v1 = _load_words(idx2_ptr, rows + BR, (rows + BR < N) & (STEPS > 1), cols, stride_idx2, g0, WPG,
                         N_GROUPS, GPC)
        v2 = _load_words(idx2_ptr, rows + 2 * BR, (rows + 2 * BR < N) & (STEPS > 2), cols, stride_idx2, g0, WPG,
                         N_GROUPS, GPC)
        u = _load_scales(scale2_ptr, rows, N, g0, N_GROUPS, CW, WPG, INTERPRET, HALVES)
        u1 = _load_scales(scale2_ptr, rows + BR, N, g0, N_GROUPS, CW, WPG, INTERPRET, HALVES)
        u2 = _load_scales(scale2_ptr, rows + 2 * BR, N, g0, N_GROUPS, CW, WPG, INTERPRET, HALVES)
    if LOOKUP != 0:
        pair_table(cb_ptr, LOOKUP, INTERPRET)
    else:
        codebook_table(cb_ptr, INTERPRET)
    # With PDL everything above reads only the layer's own tensors and may overlap the kernel
    # before; x, the partial, the split-K workspace, its tickets and the output are touched
    # only after the wait in the first _planes.
    a0, a1, a2, a3, a4, a5, a6, a7 = _planes_in_columns(x_ptr, rot_ptr, g0, K, N_GROUPS, D, GPC, X_ROTATED,
                                                        DOT_FP32, PDL, HALVES)
    if TWO_PASSES:
        b0, b1, b2, b3, b4, b5, b6, b7 = _planes_in_columns(x2_ptr, rot2_ptr, g0, K, N_GROUPS, D, GPC, X_ROTATED,
                                                            DOT_FP32, False, HALVES)
    tl.debug_barrier()  # the codebook table is filled

    # Unrolled by the prefetch depth, so the tiles in flight rotate by renaming, not moves.
    for step in tl.range(0, STEPS, loop_unroll_factor=UNROLL):
        rows = row0 + step * BR + br
        nxt = rows + 3 * BR
        nmask = (nxt < N) & (step + 3 < STEPS)
        w3 = _load_words(idx_ptr, nxt, nmask, cols, stride_idx, g0, WPG, N_GROUPS, GPC)
        s3 = _load_scales(scale_ptr, nxt, N, g0, N_GROUPS, CW, WPG, INTERPRET, HALVES)
        res = _row_sums(w, a0, a1, a2, a3, a4, a5, a6, a7, s, cb_ptr, BR, CW, LOOKUP, INTERPRET)
        if TWO_PASSES:
            v3 = _load_words(idx2_ptr, nxt, nmask, cols, stride_idx2, g0, WPG, N_GROUPS, GPC)
            u3 = _load_scales(scale2_ptr, nxt, N, g0, N_GROUPS, CW, WPG, INTERPRET, HALVES)
            res += _row_sums(v, b0, b1, b2, b3, b4, b5, b6, b7, u, cb_ptr, BR, CW, LOOKUP, INTERPRET)
            v, v1, v2 = v1, v2, v3
            u, u1, u2 = u1, u2, u3
        rmask = rows < N
        if SPLIT == 1:
            if HAS_PARTIAL:
                res += tl.load(partial_ptr + rows, mask=rmask, other=0.0)
            if HAS_BIAS:
                res += tl.load(bias_ptr + rows, mask=rmask, other=0.0)
            tl.store(out_ptr + rows, to_output(res, out_ptr), mask=rmask)
        else:
            _store_partial(ws_ptr + split * N + rows, res, rmask, INTERPRET)
        w, w1, w2 = w1, w2, w3
        s, s1, s2 = s1, s2, s3

    if SPLIT > 1:
        _release(INTERPRET)
        tl.debug_barrier()
        ticket = tl.atomic_add(ticket_ptr + chunk, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:  # every split of this chunk has stored its partials
            # All SPLIT partials of TAIL rows at once (one latency, not SPLIT), in split order.
            sp = tl.arange(0, SPLIT_P2)
            tr = tl.arange(0, TAIL)
            for t in range(0, (ROWS_CTA + TAIL - 1) // TAIL):
                trows = row0 + t * TAIL + tr
                tmask = (trows < N) & (t * TAIL + tr < ROWS_CTA)
                parts = tl.load(ws_ptr + sp[:, None] * N + trows[None, :],
                                mask=(sp < SPLIT)[:, None] & tmask[None, :], other=0.0, cache_modifier=".cg")
                acc = tl.sum(parts, axis=0)
                if HAS_PARTIAL:
                    acc += tl.load(partial_ptr + trows, mask=tmask, other=0.0)
                if HAS_BIAS:
                    acc += tl.load(bias_ptr + trows, mask=tmask, other=0.0)
                tl.store(out_ptr + trows, to_output(acc, out_ptr), mask=tmask)
            tl.atomic_xchg(ticket_ptr + chunk, 0)
