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

One program: ``BLOCK_N`` rows of ``GPP`` consecutive groups (a shared rotation is read
once for all of them); per group and pass the group's centroids times its scale (``Ŵ``, rounded to the compute dtype as ``dequant.py`` rounds it), one ``tl.dot``
with ``P_pᵀ`` (float32 accumulation), the sum of the passes rounded once into ``W_eff``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantcore.triton.interpreter import serialize_launches

from .lookup import codebook_table, group_centroids, rounded

serialize_launches()  # the interpreter's launches share module state: one at a time

__all__ = ["fold_kernel"]


@triton.jit
def _rotation_t(rot_ptr, g, D: tl.constexpr, SHARED: tl.constexpr):
    """``P_gᵀ`` [D, D] (``[j, i] = P[i, j]``): the one shared rotation, or group g's."""
    rot = rot_ptr if SHARED else rot_ptr + g * D * D
    j = tl.arange(0, D)
    return tl.load(rot + j[:, None] + j[None, :] * D)


@triton.jit
def _folded_pass(acc, p_t, idx_ptr, s_ptr, cb_ptr, rows, rmask, g, stride_idx,
                 N_GROUPS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """``acc + Ŵ_g · P_gᵀ`` for one pass: ``Ŵ_g`` [BLOCK_N, D] in natural coordinate order."""
    s = tl.load(s_ptr + rows.to(tl.int64) * N_GROUPS + g, mask=rmask, other=0.0)[:, None]
    w_hat = group_centroids(idx_ptr, rows, rmask, g, stride_idx, cb_ptr, D // 8, D, BLOCK_N, INTERPRET) * s
    if DOT_FP32:  # the interpreter's 16-bit dot is wrong; float32 activations stay exact
        return tl.dot(rounded(w_hat, p_t.dtype).to(tl.float32), p_t.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(w_hat.to(p_t.dtype), p_t, acc)


@triton.jit
def fold_kernel(idx1_ptr, s1_ptr, rot1_ptr, idx2_ptr, s2_ptr, rot2_ptr, cb_ptr, out_ptr, N, stride_idx, stride_out,
                N_GROUPS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, GPP: tl.constexpr,
                PASSES: tl.constexpr, SHARED1: tl.constexpr, SHARED2: tl.constexpr, DOT_FP32: tl.constexpr,
                INTERPRET: tl.constexpr):
    """Program ``(i, j)``: rows ``i·BLOCK_N …`` of groups ``j·GPP … j·GPP + GPP − 1`` (GPP
    divides the group count), a shared rotation loaded once for all of them."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    codebook_table(cb_ptr, INTERPRET)
    tl.debug_barrier()
    if SHARED1:
        p1_t = _rotation_t(rot1_ptr, 0, D, True)
    if PASSES == 2 and SHARED2:
        p2_t = _rotation_t(rot2_ptr, 0, D, True)
    for i in range(GPP):
        g = tl.program_id(1) * GPP + i
        rot1 = p1_t if SHARED1 else _rotation_t(rot1_ptr, g, D, False)
        acc = tl.zeros((BLOCK_N, D), dtype=tl.float32)
        acc = _folded_pass(acc, rot1, idx1_ptr, s1_ptr, cb_ptr, rows, rmask, g, stride_idx, N_GROUPS, D, BLOCK_N,
                           DOT_FP32, INTERPRET)
        if PASSES == 2:
            rot2 = p2_t if SHARED2 else _rotation_t(rot2_ptr, g, D, False)
            acc = _folded_pass(acc, rot2, idx2_ptr, s2_ptr, cb_ptr, rows, rmask, g, stride_idx, N_GROUPS, D,
                               BLOCK_N, DOT_FP32, INTERPRET)
        cols = g * D + tl.arange(0, D)
        tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_out + cols[None, :],
                 rounded(acc, out_ptr.dtype.element_ty), mask=rmask[:, None])
