"""The launches of the cuTile TurboQuant kernels (:mod:`.kernels`) and the path per batch
size, the Triton backend's algorithm (``backends/turboquant_triton/fused.py``) in cuTile:

* M = 1 — :func:`~.kernels.gemv`;
* M < ``plan.DEQUANT_FROM_M`` — :func:`~.kernels.gemm` on the matrix units, the weight looked up
  tile by tile;
* larger M — every pass dequantized by :func:`~.kernels.dequant` into one scratch
  ``[N, P·K]``, the input rotated per pass into ``[M, P·K]``, one cuBLAS GEMM of depth
  P·K (:func:`dense_passes`): there the matrix units bound the time, and cuBLAS drives them
  better than a tile loop that looks the weight up as it goes.

The tile sizes and the crossover are in :mod:`.plan`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import cuda.tile as ct
import torch

from quantcore.kernels.turboquant.base import PassData, rotate_input

from . import kernels, plan

__all__ = ["dense_passes", "fused_pass"]

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
    """``partial + x_rot Ŵᵀ (+ bias)`` for one pass, in one launch."""
    m, _ = x_rot.shape
    n = idx.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=x_rot.device)
    if m == 0:
        return out
    stream = torch.cuda.current_stream(x_rot.device)
    half = group_size // 2
    # Stand-ins for absent operands have the real ones' dtype and rank, so they do not
    # add compiled variants; the kernel never reads them.
    args = (x_rot, idx, scale, codebook, out,
            partial if partial is not None else scale, bias if bias is not None else codebook)
    # Runtime flags (not constants): every combination shares one compiled kernel, and
    # compiling is what a cuTile kernel's first call pays for.
    flags = (int(partial is not None), int(bias is not None))
    if m == 1:
        tn = plan.GEMV_ROWS
        ct.launch(stream, (-(-n // tn), m, 1), _hinted(kernels.gemv, plan.GEMV_OCCUPANCY), (*args, *flags, half, tn))
    else:
        tn, tm, tk = plan.gemm_tiles(m, half)
        grid = (-(-m // tm) * -(-n // tn), 1, 1)
        ct.launch(stream, grid, _hinted(kernels.gemm, plan.GEMM_OCCUPANCY), (*args, *flags, half, tn, tm, tk))
    return out


@functools.cache
def _hinted(kernel: Any, occupancy: int | None) -> Any:
    """``kernel`` with the occupancy hint (one object per hint: cuTile compiles per object)."""
    return kernel if occupancy is None else kernel.replace_hints(occupancy=occupancy)



def dense_passes(
    x2d: torch.Tensor,
    passes: Sequence[PassData],
    codebook: torch.Tensor,
    *,
    group_size: int,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``x (Σ_passes Ŵ_p)ᵀ (+ bias)`` as one dense GEMM of depth P·K: each pass's weight
    dequantized into its K columns of one scratch, the input rotated per pass into the
    matching columns."""
    m, k = x2d.shape
    n = passes[0].indices.shape[0]
    dtype = passes[0].rotation.dtype
    depth = len(passes) * k
    weight = torch.empty(n, depth, dtype=dtype, device=x2d.device)
    rotated = torch.empty(m, depth, dtype=dtype, device=x2d.device)
    stream = torch.cuda.current_stream(x2d.device)
    half = group_size // 2
    grid = (-(-n // plan.DEQUANT_ROWS), k // group_size, 1)
    for p, data in enumerate(passes):
        cols = slice(p * k, (p + 1) * k)
        ct.launch(stream, grid, kernels.dequant, (data.indices, data.scales, codebook, weight[:, cols], half,
                                                  plan.DEQUANT_ROWS))
        rotated[:, cols] = rotate_input(x2d, data.rotation)
    if bias is None:
        return (rotated @ weight.T).to(out_dtype)
    return torch.addmm(bias.to(dtype), rotated, weight.T).to(out_dtype)
