"""The prefill path (large M): dequantize every pass, in the rotated basis, into one
reused scratch ``W_cat [N, P·K]``, then one cuBLAS GEMM ``x_cat · W_catᵀ``. The passes
have different rotations, so they cannot be summed into one weight in the rotated
basis; stacking them along K keeps it a single matrix product of depth P·K.

Columns are interleaved per group — group g of pass p at ``(g·P + p)·d`` — so that
``x_cat`` is one GEMM of each group of x with ``[P₁ | P₂]`` ([d, P·d]), written in place,
no concatenation:

``W_cat[n, (g·P + p)·d + c] = scale_p[n, g] · codebook[idx_p[n, g·d + c]]`` in the
activation dtype: one read of the indices (½ byte per weight) and one write of the
scratch (2 bytes per weight); cuBLAS then reads it at its own pace.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantcore.triton.interpreter import serialize_launches

from .lookup import codebook_table, nibble_values

serialize_launches()  # the interpreter's launches share module state: one at a time

__all__ = ["dequant_kernel"]


@triton.jit
def dequant_kernel(idx_ptr, scale_ptr, cb_ptr, out_ptr, N, stride_idx, stride_out, col0,
                   N_GROUPS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, GPC: tl.constexpr,
                   PASSES: tl.constexpr, INTERPRET: tl.constexpr):
    pid_n = tl.program_id(0)
    g0 = tl.program_id(1) * GPC
    WPG: tl.constexpr = D // 8
    CW: tl.constexpr = GPC * WPG
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, CW)
    rmask = rows < N
    gmask = (g0 + cols // WPG) < N_GROUPS
    mask = rmask[:, None] & gmask[None, :]
    w = tl.load(idx_ptr + rows[:, None].to(tl.int64) * stride_idx + g0 * WPG + cols[None, :],
                mask=mask, other=0, eviction_policy="evict_first").to(tl.uint32, bitcast=True)
    codebook_table(cb_ptr, INTERPRET)
    s = tl.load(scale_ptr + rows[:, None].to(tl.int64) * N_GROUPS + g0 + (cols // WPG)[None, :], mask=mask, other=0.0)
    tl.debug_barrier()
    v0, v1, v2, v3, v4, v5, v6, v7 = nibble_values(w, cb_ptr, INTERPRET)
    even = tl.reshape(tl.join(tl.join(v0 * s, v4 * s), tl.join(v2 * s, v6 * s)), [BLOCK_N, CW, 4])
    odd = tl.reshape(tl.join(tl.join(v1 * s, v5 * s), tl.join(v3 * s, v7 * s)), [BLOCK_N, CW, 4])
    w_hat = tl.reshape(tl.join(even, odd), [BLOCK_N, CW * 8]).to(out_ptr.dtype.element_ty)
    ocols = tl.arange(0, CW * 8)
    g = g0 + ocols // D
    omask = rmask[:, None] & (g < N_GROUPS)[None, :]
    dst = col0 + (g * PASSES) * D + ocols % D  # group g of this pass (col0 = p·d)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_out + dst[None, :], w_hat, mask=omask)
