"""The fused TurboQuant kernels: unpack → codebook lookup → dot → rescale in one launch.

Inputs (one pass, see quantcore/transforms/turboquant_passes.py for the layout):

* ``x``       [M, K] the rotated activation, each group's even coordinates first, then
              its odd ones (so both halves are contiguous), in the dot dtype;
* ``idx``     [N, K/2] uint8, as stored: byte j of a group holds coordinates 2j, 2j+1;
* ``scale``   [N, G] float32, norms / √d;
* ``cb``      [2^bits] float32 codebook — 64 bytes that stay in L1 for every lookup;
* ``partial`` [M, N] float32, earlier passes (optional); ``bias`` [N] float32 (optional).

Two kernels share that contract:

``_gemv`` (M = 1, decode): fp32 FMAs on CUDA cores; each step loads ``GROUPS`` groups of
a ``BLOCK_N``-row stripe, reduces each group, applies its scale, accumulates.

``_gemm`` (M > 1): the weight is the left operand (``acc[N, M] = Ŵ · x_rotᵀ``), so the
dequantized tile goes from registers straight into the matrix unit, and small M needs
no padding to the MMA's 64-row minimum. The per-row scale is folded into the weight
tile before the dot (one multiply per weight element), which keeps one accumulator
chain across the K loop. Under the interpreter (and for fp32 activations) the dot runs
in fp32 with IEEE precision; on a GPU in the activation dtype with fp32 accumulation.

Dequantized weights exist only in registers; nothing but the output is written.

``N_GROUPS`` (K / d) is a compile-time constant: a layer's K never changes, and Triton
3.6's interpreter cannot loop over a runtime scalar with numpy 2 (``range`` on a
kernel argument raises "only 0-dimensional arrays can be converted to Python
scalars"), so this keeps one source for the GPU and the interpreter.
The autotuning configurations are listed below, beside the kernels.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["GEMM_CONFIGS", "GEMV_CONFIGS", "INTERPRETER_GEMM", "INTERPRETER_GEMV", "fused_pass"]

# GEMV: (BLOCK_N, GROUPS per step, warps, stages, lookup through L1 instead of on-chip gather).
# Measured on an H100 at M = 1 as CUDA-graph replays (benchmarks/turboquant_decode.py,
# results/probes/turboquant_decode-nvidia-h100-80gb-hbm3.json): short row stripes with many
# groups per step win, and the L1 lookup beats tl.gather in every tile; the gather tiles
# of 8 groups also crash Triton 3.6's TritonGPUOptimizeThreadLocality at K = 14336.
GEMV_CONFIGS = [
    triton.Config({"BLOCK_N": bn, "GROUPS": gp, "L1_LOOKUP": l1}, num_warps=w, num_stages=s)
    for bn, gp, w, s, l1 in (
        (4, 8, 4, 3, True),
        (8, 8, 8, 3, True),
        (4, 4, 2, 3, True),
        (8, 4, 4, 3, True),
        (16, 4, 4, 3, True),
        (8, 2, 2, 3, True),
        (16, 2, 4, 3, True),
        (16, 1, 4, 3, True),
    )
]
# GEMM: (BLOCK_N weight rows, BLOCK_M activation rows, BLOCK_K bytes of a group per step,
# warps, stages). Small BLOCK_M for decode-sized batches, 128-row tiles for prefill; all
# of them compile for sm_90 without register spills (``sm90.py``; 256-wide tiles spill
# once the partial-sum and bias epilogue is in).
GEMM_CONFIGS = [
    triton.Config({"BLOCK_N": bn, "BLOCK_M": bm, "BLOCK_K": bk}, num_warps=w, num_stages=s)
    for bn, bm, bk, w, s in (
        (32, 16, 32, 4, 4),
        (64, 16, 32, 4, 4),
        (128, 16, 32, 4, 4),
        (64, 32, 32, 4, 4),
        (128, 32, 32, 4, 4),
        (128, 64, 32, 4, 4),
        (128, 128, 32, 8, 3),
        (128, 128, 32, 8, 4),
    )
]
#: Fixed tiles under the interpreter: autotuning there would time numpy, slowly.
INTERPRETER_GEMV = {"BLOCK_N": 32, "GROUPS": 2, "L1_LOOKUP": False}
INTERPRETER_GEMM = {"BLOCK_N": 64, "BLOCK_M": 64, "BLOCK_K": 32}


def _fit_block_k(config: triton.Config, half: int) -> triton.Config:
    if config.kwargs["BLOCK_K"] <= half:
        return config
    kwargs = {**config.kwargs, "BLOCK_K": half}
    return triton.Config(kwargs, num_warps=config.num_warps, num_stages=config.num_stages)


def _prune_gemm(configs, named_args, **kwargs):  # type: ignore[no-untyped-def]
    """Tiles no taller than the batch needs (and no short ones for big batches), each
    group's bytes split into whole BLOCK_K steps."""
    m, half = kwargs["M_BUCKET"], kwargs["HALF"]
    keep = [c for c in configs if c.kwargs["BLOCK_M"] <= max(16, m) and (m < 512 or c.kwargs["BLOCK_M"] >= 64)]
    unique = {}
    for c in keep or configs[:1]:
        c = _fit_block_k(c, half)
        unique.setdefault(str(c), c)
    return list(unique.values())


def _prune_gemv(configs, named_args, **kwargs):  # type: ignore[no-untyped-def]
    groups = kwargs["N_GROUPS"]
    return [c for c in configs if c.kwargs["GROUPS"] <= groups] or configs[:1]


@triton.jit
def _to_output(acc, out_ptr):
    """``acc`` (fp32) in the output dtype, rounded to nearest even. For bf16 the rounding
    is done on the bits: the interpreter's own fp32 → bf16 conversion truncates, and the
    explicit form is exact on the GPU as well (the result is then representable)."""
    if out_ptr.dtype.element_ty == tl.bfloat16:
        bits = acc.to(tl.uint32, bitcast=True)
        rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000).to(tl.float32, bitcast=True)
        # A NaN keeps its own conversion: the GPU's NaN is 0x7FFFFFFF, whose rounding
        # carry runs into the sign bit and would write -0.0 (found by the H100 fuzz).
        acc = tl.where(acc != acc, acc, rounded)
    return acc.to(out_ptr.dtype.element_ty)


@triton.jit
def _lookup(codebook, packed, ROWS: tl.constexpr):
    """Centroids of the low and the high nibbles of ``packed`` [ROWS, C] (int32), from the
    codebook held on chip (registers / shared memory), not re-read from global memory."""
    src = tl.broadcast_to(codebook[None, :], [ROWS, codebook.shape[0]])
    return tl.gather(src, packed & 15, axis=1), tl.gather(src, packed >> 4, axis=1)


@triton.jit
def _lookup_l1(cb_ptr, packed):
    """The same lookup as cached global loads, one per element (GPU only). Inline PTX
    keeps Triton's pipeliner from staging these tiny gathers through shared memory."""
    lo = tl.inline_asm_elementwise("ld.global.nc.f32 $0, [$1];", "=r,l", [cb_ptr + (packed & 15)],
                                   dtype=tl.float32, is_pure=True, pack=1)
    hi = tl.inline_asm_elementwise("ld.global.nc.f32 $0, [$1];", "=r,l", [cb_ptr + (packed >> 4)],
                                   dtype=tl.float32, is_pure=True, pack=1)
    return lo, hi


@triton.jit
def _gemv_body(x_ptr, idx_ptr, scale_ptr, cb_ptr, out_ptr, partial_ptr, bias_ptr,
               N, K, stride_idx, N_GROUPS: tl.constexpr,
               HALF: tl.constexpr, LEVELS: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
               HAS_PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, L1_LOOKUP: tl.constexpr):
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_c = tl.arange(0, GROUPS * HALF)  # byte columns of one step
    grp = offs_c // HALF
    x_off = grp * (2 * HALF) + offs_c % HALF  # the low-nibble activation of each byte
    offs_g = tl.arange(0, GROUPS)
    # Row starts via a stride argument, not K // 2: Triton knows a stride argument's
    # divisibility by 16, so the byte rows load as 16-byte vectors.
    idx_rows = idx_ptr + offs_n[:, None].to(tl.int64) * stride_idx
    scale_rows = scale_ptr + offs_n[:, None].to(tl.int64) * N_GROUPS
    x_row = x_ptr + row.to(tl.int64) * K
    codebook = tl.load(cb_ptr + tl.arange(0, LEVELS))
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for step in range(0, (N_GROUPS + GROUPS - 1) // GROUPS):
        g0 = step * GROUPS
        if N_GROUPS % GROUPS == 0:
            # No column mask: a mask that varies along the row would split the loads.
            c_mask = offs_c < GROUPS * HALF
            packed = tl.load(idx_rows + (g0 * HALF + offs_c)[None, :], mask=n_mask[:, None], other=0,
                             eviction_policy="evict_first").to(tl.int32)
        else:
            c_mask = (g0 + grp) < N_GROUPS
            packed = tl.load(idx_rows + (g0 * HALF + offs_c)[None, :],
                             mask=n_mask[:, None] & c_mask[None, :], other=0,
                             eviction_policy="evict_first").to(tl.int32)
        if L1_LOOKUP:
            w_lo, w_hi = _lookup_l1(cb_ptr, packed)
        else:
            w_lo, w_hi = _lookup(codebook, packed, BLOCK_N)
        x_lo = tl.load(x_row + g0 * 2 * HALF + x_off, mask=c_mask, other=0.0).to(tl.float32)
        x_hi = tl.load(x_row + g0 * 2 * HALF + x_off + HALF, mask=c_mask, other=0.0).to(tl.float32)
        prod = w_lo * x_lo[None, :] + w_hi * x_hi[None, :]
        per_group = tl.sum(tl.reshape(prod, [BLOCK_N, GROUPS, HALF]), axis=2)
        g_mask = (g0 + offs_g) < N_GROUPS
        s = tl.load(scale_rows + (g0 + offs_g)[None, :], mask=n_mask[:, None] & g_mask[None, :], other=0.0)
        acc += tl.sum(per_group * s, axis=1)
    out_offs = row.to(tl.int64) * N + offs_n
    if HAS_PARTIAL:
        acc += tl.load(partial_ptr + out_offs, mask=n_mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)
    tl.store(out_ptr + out_offs, _to_output(acc, out_ptr), mask=n_mask)


@triton.jit
def _gemm_body(x_ptr, idx_ptr, scale_ptr, cb_ptr, out_ptr, partial_ptr, bias_ptr,
               M, N, K, stride_idx, N_GROUPS: tl.constexpr, M_BUCKET,
               HALF: tl.constexpr, LEVELS: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
               HAS_PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_FP32: tl.constexpr):
    pid = tl.program_id(0)
    # Consecutive programs share a weight stripe (pid_n) across M blocks: the weight,
    # the larger operand, is read from DRAM once and served from L2 to the rest.
    num_m = tl.cdiv(M, BLOCK_M)
    pid_n = pid // num_m
    pid_m = pid % num_m
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_j = tl.arange(0, BLOCK_K)  # BLOCK_K bytes of a group's row: 2·BLOCK_K coordinates
    n_mask = offs_n < N
    m_mask = offs_m < M
    idx_rows = idx_ptr + offs_n[:, None].to(tl.int64) * stride_idx  # see _gemv_body
    scale_rows = scale_ptr + offs_n.to(tl.int64) * N_GROUPS
    x_cols = x_ptr + offs_m[None, :].to(tl.int64) * K  # [1, BLOCK_M] row starts of x
    codebook = tl.load(cb_ptr + tl.arange(0, LEVELS))
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    CHUNKS: tl.constexpr = HALF // BLOCK_K  # steps per group
    for c in range(0, N_GROUPS * CHUNKS):
        g = c // CHUNKS
        j0 = (c % CHUNKS) * BLOCK_K
        packed = tl.load(idx_rows + (g * HALF + j0 + offs_j)[None, :], mask=n_mask[:, None], other=0,
                         eviction_policy="evict_first").to(tl.int32)
        s = tl.load(scale_rows + g, mask=n_mask, other=0.0)
        w_lo, w_hi = _lookup(codebook, packed, BLOCK_N)
        w_lo = w_lo * s[:, None]
        w_hi = w_hi * s[:, None]
        x_lo = x_cols + (g * 2 * HALF + j0 + offs_j)[:, None]
        xt_lo = tl.load(x_lo, mask=m_mask[None, :], other=0.0)
        xt_hi = tl.load(x_lo + HALF, mask=m_mask[None, :], other=0.0)
        if DOT_FP32:
            acc = tl.dot(w_lo, xt_lo.to(tl.float32), acc, input_precision="ieee")
            acc = tl.dot(w_hi, xt_hi.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w_lo.to(xt_lo.dtype), xt_lo, acc)
            acc = tl.dot(w_hi.to(xt_hi.dtype), xt_hi, acc)
    out_offs = offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
    mask = n_mask[:, None] & m_mask[None, :]
    if HAS_PARTIAL:
        acc += tl.load(partial_ptr + out_offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0)[:, None]
    tl.store(out_ptr + out_offs, _to_output(acc, out_ptr), mask=mask)


# The group geometry is in the keys: a config pruned for one group size is wrong for
# another of the same N and K (a BLOCK_K above HALF runs no step at all and writes zeros).
_gemv_tuned = triton.autotune(
    configs=GEMV_CONFIGS, key=["N", "K", "N_GROUPS"], prune_configs_by={"early_config_prune": _prune_gemv}
)(_gemv_body)
_gemm_tuned = triton.autotune(
    configs=GEMM_CONFIGS, key=["M_BUCKET", "N", "K", "HALF"], prune_configs_by={"early_config_prune": _prune_gemm}
)(_gemm_body)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def m_bucket(m: int) -> int:
    """Autotuning key for M: the next power of two, capped, so serving with varying batch
    sizes tunes a handful of times, not once per size."""
    return min(1 << max(m - 1, 0).bit_length(), 4096)


def fused_pass(
    x_rot: torch.Tensor,
    idx: torch.Tensor,
    scale: torch.Tensor,
    codebook: torch.Tensor,
    *,
    group_size: int,
    partial: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    m, k = x_rot.shape
    n = idx.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=x_rot.device)
    if m == 0:
        return out
    common = dict(
        N=n, K=k, stride_idx=idx.stride(0), N_GROUPS=k // group_size, HALF=group_size // 2,
        LEVELS=codebook.shape[0],
        HAS_PARTIAL=partial is not None, HAS_BIAS=bias is not None,
    )
    args = (x_rot, idx, scale, codebook, out, partial if partial is not None else out,
            bias if bias is not None else scale)
    if m == 1:
        if _interpreting():
            cfg = INTERPRETER_GEMV
            _gemv_body[(triton.cdiv(n, cfg["BLOCK_N"]), m)](*args, **common, **cfg)
        else:
            _gemv_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), m)](*args, **common)
        return out
    dot_fp32 = x_rot.dtype == torch.float32
    if _interpreting():
        cfg = {**INTERPRETER_GEMM, "BLOCK_K": min(INTERPRETER_GEMM["BLOCK_K"], group_size // 2)}
        grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
        _gemm_body[grid](*args, M=m, M_BUCKET=m_bucket(m), **common, DOT_FP32=dot_fp32, **cfg)
    else:
        _gemm_tuned[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)](
            *args, M=m, M_BUCKET=m_bucket(m), **common, DOT_FP32=dot_fp32
        )
    return out
