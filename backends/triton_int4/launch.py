"""Launching the kernels: the plan (configs.py), the grid, the split-K buffers, and the
dequantize-into-a-scratch + cuBLAS path. Imports triton (through kernels.py): load it
only when a call runs."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import triton

from quantcore.probe.card_tables import cuda_card
from quantcore.triton.buffers import KeptBuffers, grown

from .configs import DEQUANT_BLOCK_N, INTERPRETER_MMA, Plan, Shape, plan_for
from .kernels import dequant_kernel, gemv_kernel, mma_kernel
from .layout import SLICE, TritonIntWeights, block_k, pairs

__all__ = ["close_slices", "interpreting", "linear", "plan_of"]


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def close_slices(w: TritonIntWeights) -> int:
    """Slices between two scale groups' closes: every slice of a block shares a group
    when groups are whole blocks (or there is one group); groups that split a block
    evenly close every ``SG/32`` slices; any other size closes after every slice."""
    sg, bk = w.sub_group, block_k(w.bits)
    if w.num_groups == 1 or sg % bk == 0:
        return pairs(w.bits)
    if bk % sg == 0:
        return sg // SLICE
    return 1


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def plan_of(x2: torch.Tensor, w: TritonIntWeights) -> Plan:
    m = x2.shape[0]
    if interpreting():
        # The path the GPU runs at every M (the GEMV only when a plan names it), with fp32
        # operands and few, large programs.
        block_m = max(16, min(64, 1 << (m - 1).bit_length()))
        return Plan("mma", mma=dataclasses.replace(INTERPRETER_MMA, block_m=block_m))
    shape = Shape(m, w.in_features, w.out_features, w.bits, close_slices(w), _dtype_name(x2.dtype))
    return plan_for(shape, cuda_card(x2.device))


def _counters(w: TritonIntWeights, tiles: int, device: torch.device) -> torch.Tensor:
    """The split-K arrival counters (int32, zero between launches: the last program of a
    tile resets its own), kept with the weight; grown on demand."""
    return grown(w.runtime, ("counters", device), tiles, torch.int32, device, zero=True, minimum=1024)


#: One dequantization scratch per (device, dtype), shared by every layer and grown to the
#: largest: the dense weight exists only while one call runs.
_SCRATCH = KeptBuffers(None, zero=False)


def _scratch_for(device: torch.device, dtype: torch.dtype, numel: int) -> torch.Tensor:
    return _SCRATCH.get((device, dtype), numel, device, dtype)[:numel]


def _common(w: TritonIntWeights) -> dict[str, Any]:
    return dict(
        NUM_GROUPS=w.num_groups,
        NUM_SUB=w.group_map.numel() if w.group_map is not None else 1,
        BITS=w.bits, SG=w.sub_group, BLOCKS=w.blocks,
        HAS_ZEROS=w.zeros is not None, HAS_MAP=w.group_map is not None,
    )


def linear(x2: torch.Tensor, w: TritonIntWeights, plan: Plan | None = None) -> torch.Tensor:
    """``y = x2 · Ŵᵀ + b`` for a contiguous ``x2`` [M, K] (already permuted by ret_idx)."""
    m, k = x2.shape
    n = w.out_features
    plan = plan or plan_of(x2, w)
    y = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    any_t = w.scales
    zeros = w.zeros if w.zeros is not None else any_t
    gmap = w.group_map if w.group_map is not None else any_t
    bias = w.bias if w.bias is not None else any_t
    common = _common(w)
    flags = dict(EVEN_K=k % block_k(w.bits) == 0, ASM=not interpreting())
    if plan.path == "dequant":
        dense = _scratch_for(x2.device, x2.dtype, n * k).view(n, k)
        grid = (triton.cdiv(n, DEQUANT_BLOCK_N), w.blocks)
        dequant_kernel[grid](w.qweight.view(torch.int16), w.scales, zeros, gmap, dense, n, k, **common,
                             BLOCK_N=DEQUANT_BLOCK_N)
        b = w.bias.to(x2.dtype) if w.bias is not None else None
        return torch.nn.functional.linear(x2, dense, b)
    if plan.path == "gemv":
        cfg = plan.gemv
        assert cfg is not None
        steps = triton.cdiv(triton.cdiv(w.blocks, cfg.split_k), cfg.block_b)
        split = triton.cdiv(w.blocks, steps * cfg.block_b)
        grid = (triton.cdiv(n, cfg.block_n), m, split)
        tiles = grid[0] * m
        kernel, weight, tile_args = gemv_kernel, w.qweight, dict(BLOCK_N=cfg.block_n, BLOCK_B=cfg.block_b)
        close = close_slices(w)
    else:
        cfg = plan.mma  # type: ignore[assignment]
        assert cfg is not None
        steps = triton.cdiv(triton.cdiv(w.blocks, cfg.split_k), cfg.block_b)  # type: ignore[union-attr]
        split = triton.cdiv(w.blocks, steps * cfg.block_b)  # type: ignore[union-attr]
        grid = (triton.cdiv(n, cfg.block_n) * triton.cdiv(m, cfg.block_m), split)  # type: ignore[assignment]
        tiles = grid[0]
        kernel, weight = mma_kernel, w.qweight.view(torch.int16)
        tile_args = dict(BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, BLOCK_B=cfg.block_b,  # type: ignore[union-attr]
                         OPERAND=cfg.operand)  # type: ignore[union-attr]
        close = close_slices(w)
    if split > 1:
        ws = torch.empty(split * m * n, dtype=torch.float32, device=x2.device)
        counters = _counters(w, tiles, x2.device)
    else:
        ws = counters = any_t
    kernel[grid](
        x2, weight, w.scales, zeros, gmap, bias, y, ws, counters,
        m, n, k, x2.stride(0), y.stride(0), **common,
        CLOSE=close, HAS_BIAS=w.bias is not None, SPLIT_K=split, STEPS=steps, **tile_args, **flags,
        EVEN_N=n % cfg.block_n == 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y
