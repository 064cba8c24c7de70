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

Codes to floats without the slow integer-to-float unit (``MAGIC``, TensorRT-LLM's own
trick): ``0x4B000000 | u`` is the float32 2²³ + u, so subtracting 2²³ + 128 leaves q
exactly; q has at most 8 significant bits, so its bf16 is the float32's upper half; for
fp16, ``0x6400 | u`` is 1024 + u and subtracting 1152 leaves q.

Dequantization is fused in one of two ways:

- ``PRE_SCALE = False`` (decode): per K-tile of one group, ``acc += scale[n] · (q · x)``
  and, asymmetric, ``acc += zero[n] · Σ_k x``. The codes are exact in fp16/bf16, so only
  the output is rounded; the scaling costs ``BM`` multiply-adds per column per tile.
- ``PRE_SCALE = True`` (prefill): ``w = q · scale (+ zero)`` in float32, rounded to the
  activation dtype (as TensorRT-LLM's kernels do), and the dot accumulates into ``acc``
  across tiles, so the tensor cores never wait for an epilogue.

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

__all__ = ["codes_bf16", "codes_f16", "codes_f32", "moe_w8a16_kernel"]


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
    PRE_SCALE: tl.constexpr, MAGIC: tl.constexpr,
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
            g = k0 // GROUP
            scale = tl.load(s_ptr + sz_row + g * N, mask=n_ok, other=0.0).to(tl.float32)
            if not SYM:
                zero = tl.load(z_ptr + sz_row + g * N, mask=n_ok, other=0.0).to(tl.float32)
            if PRE_SCALE or FP32_DOT or not MAGIC:
                q = codes_f32(u, MAGIC)
            elif xt.dtype == tl.bfloat16:
                q = codes_bf16(u)
            else:
                q = codes_f16(u)
            if PRE_SCALE:
                w = q * scale[:, None]
                if not SYM:
                    w += zero[:, None]
                if FP32_DOT:
                    acc = tl.dot(w, xt.to(tl.float32), acc)
                else:
                    acc = tl.dot(w.to(xt.dtype), xt, acc)
            else:
                if FP32_DOT:  # noqa: SIM108 (constexpr branches read better as blocks)
                    part = tl.dot(q, xt.to(tl.float32))
                else:
                    part = tl.dot(q.to(xt.dtype), xt)
                acc += part * scale[:, None]
                if not SYM:
                    acc += zero[:, None] * tl.sum(xt.to(tl.float32), axis=0)[None, :]
        if HAS_RW:
            acc *= tl.load(rw_ptr + routes, mask=valid, other=0.0)[None, :]
        out = y_ptr + routes.to(tl.int64)[None, :] * stride_y + offs_n[:, None]
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=valid[None, :] & n_ok[:, None])


@triton.jit
def codes_f32(u, MAGIC: tl.constexpr):
    """Signed codes q as float32 from the biased bytes u = q + 128 (int8 bits)."""
    if MAGIC:
        return ((u.to(tl.int32) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0
    return (u ^ -128).to(tl.float32)


@triton.jit
def codes_bf16(u):
    """q as bf16: the upper half of the exact float32 (q has at most 8 significant bits)."""
    return (codes_f32(u, True).to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def codes_f16(u):
    """q as fp16: ``0x6400 | u`` is 1024 + u; minus 1152 is q, exactly."""
    return ((u.to(tl.int16) & 0xFF) | 0x6400).to(tl.float16, bitcast=True) - 1152.0
