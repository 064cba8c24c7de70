"""``fused_linear``: one TurboQuant linear (every pass, or one pass with a running
``partial``) on the path that suits M, chosen here:

* M = 1 — ``gemv.py``: CUDA-core decode kernel, rotation fused in, split over K, all
  passes in one launch;
* M ≤ ``mma_max_m`` — ``mma.py``: tensor-core kernel on the input rotated once per call
  (one small GEMM per pass), split over K, all passes in one launch;
* larger M — ``dequant.py``: dequantize every pass into a reused scratch, one cuBLAS GEMM.

The thresholds come from ``configs.path_for`` (measured per device). Layouts: indices
are read as int32 words (natural coordinate order, ``lookup.py``), scales are float32
``norms / √d``, rotations ``P = Πᵀ`` in the compute dtype (``split_halves=False``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
import triton

from quantcore.kernels.turboquant.base import PassData, rotate_input
from quantcore.tensors import laid_out

from . import configs
from .dequant import dequant_kernel
from .gemv import gemv_kernel
from .lookup import to_output
from .mma import mma_kernel
from .workspace import tickets

__all__ = ["fused_linear", "interpreting"]

#: Re-exported for the NaN-rounding regression test.
_to_output = to_output


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _words(indices: torch.Tensor) -> torch.Tensor:
    """[N, K/2] uint8 → [N, K/8] int32 (no copy: prepared indices are contiguous and aligned)."""
    return laid_out(indices).view(torch.int32)


def _dot_fp32(x: torch.Tensor) -> bool:
    return interpreting() or x.dtype == torch.float32


def _gemv(x2d: torch.Tensor, passes: Sequence[PassData], codebook: torch.Tensor, d: int,
          partial: torch.Tensor | None, bias: torch.Tensor | None, out: torch.Tensor,
          config: configs.GemvConfig | None = None) -> None:
    k = x2d.shape[1]
    n = out.shape[1]
    groups = k // d
    device = x2d.device
    cfg = config or configs.gemv_config(_device_name(device), k, n, d, len(passes), x2d.dtype)
    gpc = min(cfg.gpc, 1 << (groups - 1).bit_length(), 16)
    split = triton.cdiv(groups, gpc)
    chunks = max(1, min(triton.cdiv(n, cfg.br), round(cfg.ctas / split)))
    rows_cta = triton.cdiv(triton.cdiv(n, chunks), cfg.br) * cfg.br
    chunks = triton.cdiv(n, rows_cta)
    shared = passes[0].rotation.shape[0] == 1
    xs = [x2d if shared else rotate_input(x2d, p.rotation) for p in passes]
    ws = torch.empty(split, n, dtype=torch.float32, device=device) if split > 1 else out
    tk = tickets(device, chunks) if split > 1 else codebook
    p1, p2 = passes[0], passes[-1]
    grid = (chunks, split)
    gemv_kernel[grid](
        xs[0], xs[-1], _words(p1.indices), p1.scales, p1.rotation, _words(p2.indices), p2.scales, p2.rotation,
        codebook, out, partial if partial is not None else out, bias if bias is not None else codebook, ws, tk,
        n, k // 8, k // 8,
        N_GROUPS=groups, D=d, GPC=gpc, SPLIT=split, SPLIT_P2=triton.next_power_of_2(split), ROWS_CTA=rows_cta,
        BR=cfg.br, TAIL=min(128, triton.next_power_of_2(rows_cta)), UNROLL=cfg.unroll,
        TWO_PASSES=len(passes) == 2, X_ROTATED=not shared, HAS_PARTIAL=partial is not None,
        HAS_BIAS=bias is not None, DOT_FP32=_dot_fp32(xs[0]), INTERPRET=interpreting(),
        num_warps=cfg.warps, num_stages=1,
    )


def _mma(x2d: torch.Tensor, passes: Sequence[PassData], codebook: torch.Tensor, d: int,
         partial: torch.Tensor | None, bias: torch.Tensor | None, out: torch.Tensor,
         config: configs.MmaConfig | None = None) -> None:
    m, k = x2d.shape
    n = out.shape[1]
    groups = k // d
    device = x2d.device
    cfg = config or configs.mma_config(_device_name(device), m, k, n, d, len(passes), x2d.dtype)
    tiles_n = triton.cdiv(n, cfg.block_n)
    tiles_m = triton.cdiv(m, cfg.block_m)
    # Split K only as far as needed to fill the GPU (each split costs a partial tile).
    split = max(1, min(triton.cdiv(groups, cfg.gpc), triton.cdiv(cfg.ctas, tiles_n * tiles_m)))
    gpc = triton.cdiv(groups, split)
    split = triton.cdiv(groups, gpc)
    xs = [rotate_input(x2d, p.rotation).contiguous() for p in passes]
    ws = torch.empty(split, m, n, dtype=torch.float32, device=device) if split > 1 else out
    tk = tickets(device, tiles_n * tiles_m) if split > 1 else codebook
    p1, p2 = passes[0], passes[-1]
    mma_kernel[(tiles_n, split, tiles_m)](
        xs[0], xs[-1], _words(p1.indices), p1.scales, _words(p2.indices), p2.scales,
        codebook, out, partial if partial is not None else out, bias if bias is not None else codebook, ws, tk,
        m, n, k // 8, k // 8,
        N_GROUPS=groups, D=d, GPC=gpc, SPLIT=split, BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m,
        TWO_PASSES=len(passes) == 2, HAS_PARTIAL=partial is not None, HAS_BIAS=bias is not None,
        DOT_FP32=_dot_fp32(xs[0]), INTERPRET=interpreting(),
        num_warps=cfg.warps, num_stages=cfg.stages,
    )


def _scratch_for(device: torch.device, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """The dequantization scratch: from torch's caching allocator at every call, which hands
    the same block back call after call. (A module-level buffer grown in place broke CUDA
    graphs: a graph captured before the growth kept writing to the freed block.)"""
    return torch.empty(numel, dtype=dtype, device=device)


def dequantize_rotated(passes: Sequence[PassData], codebook: torch.Tensor, d: int, dtype: torch.dtype,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """``W_cat [N, P·K]``: every pass's scaled centroids in the rotated basis, group g of
    pass p in columns ``(g·P + p)·d …`` (``dequant.py``)."""
    n, half = passes[0].indices.shape
    k = 2 * half
    groups = k // d
    w_cat = out if out is not None else torch.empty(n, len(passes) * k, dtype=dtype, device=codebook.device)
    block_n, gpc = 32, max(1, 256 // d)  # 8192 weights a program: no register spills on sm_90
    gpc = min(gpc, 1 << (groups - 1).bit_length())
    for p, data in enumerate(passes):
        dequant_kernel[(triton.cdiv(n, block_n), triton.cdiv(groups, gpc))](
            _words(data.indices), data.scales, codebook, w_cat, n, k // 8, w_cat.stride(0), p * d,
            N_GROUPS=groups, D=d, BLOCK_N=block_n, GPC=gpc, PASSES=len(passes), INTERPRET=interpreting(),
            num_warps=4,
        )
    return w_cat


def rotate_interleaved(x2d: torch.Tensor, passes: Sequence[PassData], d: int) -> torch.Tensor:
    """``x_cat [M, P·K]`` matching ``dequantize_rotated``'s columns: each group of x times
    ``[P₁ | P₂]`` in one GEMM (shared rotations), else one rotation per pass, interleaved."""
    m, k = x2d.shape
    if len(passes) == 1:
        return rotate_input(x2d, passes[0].rotation)
    if all(p.rotation.shape[0] == 1 for p in passes):
        both = torch.cat([p.rotation[0] for p in passes], dim=1)  # [d, P·d]: tiny, next to the GEMM
        x = x2d.to(both.dtype).reshape(m * (k // d), d)
        return (x @ both).reshape(m, len(passes) * k)
    parts = [rotate_input(x2d, p.rotation).view(m, k // d, 1, d) for p in passes]
    return torch.cat(parts, dim=2).reshape(m, len(passes) * k)


def _dequant_gemm(x2d: torch.Tensor, passes: Sequence[PassData], codebook: torch.Tensor, d: int,
                  partial: torch.Tensor | None, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    k = x2d.shape[1]
    n = out.shape[1]
    cdt = passes[0].rotation.dtype
    width = len(passes) * k
    w_cat = dequantize_rotated(passes, codebook, d, cdt, _scratch_for(x2d.device, cdt, n * width).view(n, width))
    x_cat = rotate_interleaved(x2d, passes, d)
    if partial is None and out.dtype == cdt:
        # cuBLAS accumulates in fp32 and rounds once into ``out``; the bias is added in its
        # epilogue. (An fp32 result re-read for the bias cost ~100 µs at N = 14336, M = 2048.)
        if bias is not None:
            torch.addmm(bias.to(cdt), x_cat, w_cat.T, out=out)
        else:
            torch.mm(x_cat, w_cat.T, out=out)
        return
    if x2d.device.type == "cuda" and cdt in (torch.bfloat16, torch.float16):
        y = torch.mm(x_cat, w_cat.T, out_dtype=torch.float32)  # the partial is fp32: one rounding
    else:
        y = torch.mm(x_cat.to(torch.float32), w_cat.T.to(torch.float32))
    if partial is not None:
        y += partial
    if bias is not None:
        y += bias
    out.copy_(y)


def fused_linear(
    x2d: torch.Tensor,
    passes: Sequence[PassData],
    codebook: torch.Tensor,
    *,
    group_size: int,
    partial: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    path: str | None = None,
    config: Any = None,
) -> torch.Tensor:
    """``partial + Σ_passes x Ŵ_pᵀ (+ bias)`` as [M, N] in ``out_dtype``. ``path``
    ("gemv", "mma", "dequant") and ``config`` override the choice (benchmarks, tests)."""
    if not 1 <= len(passes) <= 2:
        raise ValueError(f"fused_linear takes one or two passes, got {len(passes)}")
    x2d = x2d.contiguous()
    m = x2d.shape[0]
    n = passes[0].indices.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=x2d.device)
    if m == 0:
        return out
    if path is None:
        choice = configs.path_for(_device_name(x2d.device))
        path = "gemv" if m <= choice.gemv_max_m else "mma" if m <= choice.mma_max_m else "dequant"
    if path == "gemv":
        if m != 1:
            raise ValueError(f"the decode kernel takes M = 1, got M = {m}")
        _gemv(x2d, passes, codebook, group_size, partial, bias, out, config)
    elif path == "mma":
        _mma(x2d, passes, codebook, group_size, partial, bias, out, config)
    elif path == "dequant":
        _dequant_gemm(x2d, passes, codebook, group_size, partial, bias, out)
    else:
        raise ValueError(f"path: expected 'gemv', 'mma' or 'dequant', got {path!r}")
    return out
