"""The prefill path with the rotation folded into the weight: ``W_eff [N, K]``, then one
cuBLAS GEMM of the activation as it comes.

A pass computes ``y = Σ_g (x_g P_g) Ŵ_gᵀ`` (``P = Πᵀ``, ``Ŵ`` in the rotated basis). The
same sum is ``Σ_g x_g (Ŵ_g P_gᵀ)ᵀ``, so with

``W_eff[n, g·d + i] = Σ_p Σ_j Ŵ_p[n, g·d + j] · P_p,g[i, j]``

the layer is one GEMM ``x · W_effᵀ`` of depth K, whatever the number of passes. Against
``dequant.py`` (every pass dequantized side by side, the input rotated by a GEMM of its
own, one GEMM of depth P·K) it trades the input's rotation (M·K·d multiply-adds per pass
and a round trip of x through memory, a launch) for the weight's (N·K·d per pass, inside
the dequantization, whose cost is its memory traffic), and with two passes it halves the
big GEMM: worth it from M > d with two passes, and at large M with one.

A program writes ``BLOCK_N`` rows of several groups (``fold_kernel``: consecutive groups
of one row block, or persistent over all tiles; a shared rotation read once for all of
them); per group and pass the group's centroids times its scale (``Ŵ``, rounded to the
compute dtype as ``dequant.py`` rounds it), one ``tl.dot`` with ``P_pᵀ`` (float32
accumulation), the sum of the passes rounded once into ``W_eff``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantcore.triton.interpreter import serialize_launches

from .lookup import codebook_table, group_centroids, rounded
from .operand import register_operand

serialize_launches()  # the interpreter's launches share module state: one at a time

__all__ = ["fold_kernel"]


@triton.jit
def _rotation_t(rot_ptr, g, D: tl.constexpr, SHARED: tl.constexpr, REG_OPERAND: tl.constexpr):
    """``P_gᵀ`` [D, D], row r for the coordinate at position r of the weight operand
    (``[r, i] = P[i, c(r)]``, ``operand.operand_order``): the one shared rotation, or
    group g's. Read as stored (rows of P, 16-byte loads), transposed in registers."""
    rot = rot_ptr if SHARED else rot_ptr + g * D * D
    i = tl.arange(0, D)
    p = tl.load(rot + i[:, None] * D + i[None, :])  # [i, c] = P[i, c]
    if REG_OPERAND:  # c = 4e + q sits at position (D/4)·q + e
        return tl.reshape(tl.permute(tl.reshape(p, [D, D // 4, 4]), (2, 1, 0)), [D, D])
    return tl.trans(p)


@triton.jit
def _folded_pass(acc, p_t, idx_ptr, s_ptr, cb_ptr, rows, rmask, g, stride_idx,
                 N_GROUPS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, REG_OPERAND: tl.constexpr,
                 DOT_FP32: tl.constexpr, INTERPRET: tl.constexpr):
    """``acc + Ŵ_g · P_gᵀ`` for one pass, ``Ŵ_g`` [BLOCK_N, D] = centroid · scale rounded to
    the rotation's dtype: in natural coordinate order through shared memory, or with
    ``REG_OPERAND`` made in the matrix unit's register layout (``operand.py``; its columns,
    and ``p_t``'s rows, in that operand's coordinate order — the same products, summed in
    another order)."""
    s = tl.load(s_ptr + rows.to(tl.int64) * N_GROUPS + g, mask=rmask, other=0.0)[:, None]
    if REG_OPERAND:
        w_hat = register_operand(idx_ptr, rows, rmask, g, stride_idx, cb_ptr, s, p_t.dtype, D, BLOCK_N, True,
                                 DOT_FP32, INTERPRET)
        if DOT_FP32:
            return tl.dot(w_hat, p_t.to(tl.float32), acc, input_precision="ieee")
        return tl.dot(w_hat, p_t, acc)
    w_hat = group_centroids(idx_ptr, rows, rmask, g, stride_idx, cb_ptr, D // 8, D, BLOCK_N, INTERPRET) * s
    if DOT_FP32:  # the interpreter's 16-bit dot is wrong; float32 activations stay exact
        return tl.dot(rounded(w_hat, p_t.dtype).to(tl.float32), p_t.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(w_hat.to(p_t.dtype), p_t, acc)


@triton.jit
def fold_kernel(idx1_ptr, s1_ptr, rot1_ptr, idx2_ptr, s2_ptr, rot2_ptr, cb_ptr, out_ptr, N, stride_idx, stride_out,
                N_GROUPS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, GPP: tl.constexpr, ITERS: tl.constexpr,
                PERSISTENT: tl.constexpr, PASSES: tl.constexpr, SHARED1: tl.constexpr, SHARED2: tl.constexpr,
                REG_OPERAND: tl.constexpr, STAGES: tl.constexpr, DOT_FP32: tl.constexpr, INTERPRET: tl.constexpr):
    """A tile is ``BLOCK_N`` rows of one group. Program ``(i, j)`` writes rows ``i·BLOCK_N …``
    of groups ``j·GPP … j·GPP + GPP − 1`` (GPP divides the group count; ``ITERS`` = GPP);
    ``PERSISTENT``: program p of P writes tiles p, p + P, … (``ITERS`` = ⌈tiles / P⌉; a tile
    past the last has rows past N, all masked), so no partial last wave. (A constexpr: the
    interpreter's ``range`` takes no runtime bound.) A shared rotation is loaded once per
    program; ``STAGES`` software-pipelines the tile loop (1: none)."""
    codebook_table(cb_ptr, INTERPRET)
    tl.debug_barrier()
    if SHARED1:
        p1_t = _rotation_t(rot1_ptr, 0, D, True, REG_OPERAND)
    if PASSES == 2 and SHARED2:
        p2_t = _rotation_t(rot2_ptr, 0, D, True, REG_OPERAND)
    for i in tl.range(0, ITERS, num_stages=STAGES):
        if PERSISTENT:
            t = tl.program_id(0) + i * tl.num_programs(0)
            row_block = t // N_GROUPS
            g = t % N_GROUPS
        else:
            row_block = tl.program_id(0)
            g = tl.program_id(1) * GPP + i
        rows = row_block * BLOCK_N + tl.arange(0, BLOCK_N)
        rmask = rows < N
        rot1 = p1_t if SHARED1 else _rotation_t(rot1_ptr, g, D, False, REG_OPERAND)
        acc = tl.zeros((BLOCK_N, D), dtype=tl.float32)
        acc = _folded_pass(acc, rot1, idx1_ptr, s1_ptr, cb_ptr, rows, rmask, g, stride_idx, N_GROUPS, D, BLOCK_N,
                           REG_OPERAND, DOT_FP32, INTERPRET)
        if PASSES == 2:
            rot2 = p2_t if SHARED2 else _rotation_t(rot2_ptr, g, D, False, REG_OPERAND)
            acc = _folded_pass(acc, rot2, idx2_ptr, s2_ptr, cb_ptr, rows, rmask, g, stride_idx, N_GROUPS, D,
                               BLOCK_N, REG_OPERAND, DOT_FP32, INTERPRET)
        cols = g * D + tl.arange(0, D)
        tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_out + cols[None, :],
                 rounded(acc, out_ptr.dtype.element_ty), mask=rmask[:, None])
