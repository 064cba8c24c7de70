"""The Triton grouped W8A16 GEMM over TensorRT-LLM's preprocessed MoE weight layout.

Imported only when the Triton kernel runs (it imports triton).

Weight layout read (int8, fp16/bf16 activations, SM 75–90 and the MoE path on SM 90;
see ``preprocess``): per expert, byte

    addr(p, n) = (n // 2) · 2K + (p // 64) · 128 + (n % 2) · 64 + p % 64

holds the *biased* code u = q + 128 of column n at stored position p, which is logical
row k = 64 · (p // 64) + σ(p % 64) with σ(j) = 16 · (j // 16) + (j % 16) // 2 + 8 · (j % 2)
(the LDSM row permutation composed with the register byte swap). The reduction over K
does not care about order, so the kernel walks stored positions p and reads the
activations permuted by σ (``x_perm[:, p] = x[:, k(p)]``, done once per call by the
wrapper); a group of 64 or 128 rows is a union of whole 64-row chunks, so the group of
p is ``p // group_size`` as it is for k. ``u ^ 0x80`` is the signed code.

Each program owns one expert, ``BN`` output columns and up to ``BM`` routes, and
computes the transposed tile ``acc[BN, BM] = Wᵀ · xᵀ`` so that the dequantized weight
is the left operand (registers) and a handful of tokens can be the narrow side.
Dequantization is fused: per K-tile of one group, ``acc += scale[n] · (q · x)`` and,
asymmetric, ``acc += zero[n] · Σ_k x``; the codes are exact in fp16/bf16, the dot
accumulates in fp32, and the output is rounded once.

K is a compile-time constant: a loop bound read from a run-time scalar breaks
Triton 3.6's interpreter under NumPy 2.4 (``int()`` of a one-element array), and a
model has few distinct K.

Routes reach a program in one of two ways (``DENSE``):

- dense: program (e, n-tile) takes all R ≤ BM routes and keeps those whose id is e;
  an expert no route chose returns at once. No sorting, one launch: decode.
- sorted: routes sorted by expert and padded to multiples of BM
  (:func:`..routing.align_routes`); program (block, n-tile) reads its block's expert
  and routes. Prefill.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["moe_w8a16_kernel"]


@triton.jit
def moe_w8a16_kernel(
    x_ptr, stride_x,
    w_ptr, s_ptr, z_ptr,
    ids_ptr, sorted_ptr, block_expert_ptr, rw_ptr,
    y_ptr, stride_y,
    R, N, G, x_div,
    K: tl.constexpr, GROUP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    SYM: tl.constexpr, DENSE: tl.constexpr, HAS_RW: tl.constexpr, FP32_DOT: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = tl.arange(0, BM)
    if DENSE:
        e = pid_r
        routes = offs_m
        ids = tl.load(ids_ptr + offs_m, mask=offs_m < R, other=-1)
        valid = ids == e
    else:
        e = tl.load(block_expert_ptr + pid_r)
        routes = tl.load(sorted_ptr + pid_r * BM + offs_m)
        valid = routes < R
    if tl.sum(valid.to(tl.int32), axis=0) > 0:
        offs_n = pid_n * BN + tl.arange(0, BN)
        n_ok = offs_n < N
        offs_p = tl.arange(0, BK)
        e64 = e.to(tl.int64)
        w_cols = w_ptr + e64 * K * N + (offs_n // 2) * (2 * K) + (offs_n % 2) * 64
        w_rows = (offs_p // 64) * 128 + offs_p % 64
        x_rows = x_ptr + (routes // x_div).to(tl.int64) * stride_x
        sz_row = e64 * G * N + offs_n
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        for k0 in range(0, K, BK):
            u = tl.load(w_cols[:, None] + (k0 * 2 + w_rows)[None, :], mask=n_ok[:, None], other=0)
            xt = tl.load(x_rows[None, :] + (k0 + offs_p)[:, None], mask=valid[None, :], other=0.0)
            q = u ^ -128  # the biased byte's top bit flipped: the signed code
            if FP32_DOT:
                part = tl.dot(q.to(tl.float32), xt.to(tl.float32))
            else:
                part = tl.dot(q.to(xt.dtype), xt)
            g = k0 // GROUP
            scale = tl.load(s_ptr + sz_row + g * N, mask=n_ok, other=0.0).to(tl.float32)
            acc += part * scale[:, None]
            if not SYM:
                zero = tl.load(z_ptr + sz_row + g * N, mask=n_ok, other=0.0).to(tl.float32)
                acc += zero[:, None] * tl.sum(xt.to(tl.float32), axis=0)[None, :]
        if HAS_RW:
            acc *= tl.load(rw_ptr + routes, mask=valid, other=0.0)[None, :]
        out = y_ptr + routes.to(tl.int64)[None, :] * stride_y + offs_n[:, None]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=valid[None, :] & n_ok[:, None])
