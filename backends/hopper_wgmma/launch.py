"""Launching the kernel: the plan, the TMA descriptors, the grid and the split-K buffers.
Imports triton (through kernels.py): load it only when a call runs (or a probe compiles)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from quantcore.probe.card import CardKey, card_key
from quantcore.triton.buffers import grown

from .configs import SMEM_RESERVE, Shape, plan_for
from .kernels import wgmma_kernel
from .layout import SLICE, TILE_N, HopperWeights, block_k
from .plans import Plan

__all__ = ["Walk", "kernel_args", "linear", "plan_of", "prepare_x", "split_steps"]

_GL_DTYPE = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32,
             torch.int16: gl.int16, torch.uint8: gl.uint8}
_cards: dict[int, CardKey] = {}


def _card(device: torch.device) -> CardKey:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _cards:
        _cards[index] = card_key(index)
    return _cards[index]


def sub_rows(w: HopperWeights) -> int:
    """Rows of scales one block reads (one, or block/SG when groups split a block)."""
    return max(1, block_k(w.bits) // w.sub_group)


def fit_stages(plan: Plan, w: HopperWeights, smem_bytes: int) -> Plan:
    """``plan`` with its ring no deeper than the card's shared memory holds."""
    per = plan.stage_bytes(w.bits, w.scales.element_size(), sub_rows(w), w.zeros is not None)
    most = max(2, (smem_bytes - SMEM_RESERVE) // per)
    return plan if plan.stages <= most else dataclasses.replace(plan, stages=most)


def plan_of(m: int, w: HopperWeights, device: torch.device) -> Plan:
    card = _card(device)
    plan = plan_for(Shape(m, w.in_features, w.out_features, w.bits), card)
    return fit_stages(plan, w, card.smem_kib * 1024)


def prepare_x(x2: torch.Tensor) -> torch.Tensor:
    """x as TMA reads it: contiguous, 16-byte aligned, K a multiple of 32 (zero-padded)."""
    m, k = x2.shape
    k32 = -(-k // SLICE) * SLICE
    if k32 == k and x2.is_contiguous() and x2.data_ptr() % 16 == 0:
        return x2
    out = torch.zeros(m, k32, dtype=x2.dtype, device=x2.device)
    out[:, :k] = x2
    return out


def _nvmma(dtype: torch.dtype, rank: int, swizzle: int = 0) -> Any:
    bits = torch.finfo(dtype).bits if dtype.is_floating_point else torch.iinfo(dtype).bits
    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=bits, rank=rank)


def weight_descriptors(w: HopperWeights, wg: int) -> tuple[Any, Any, Any]:
    """The TMA descriptors of the prepared weight for ``wg`` tiles per CTA (cached)."""
    key = ("descriptors", wg)
    have = w.runtime.get(key)
    if have is None:
        tiles, blocks = w.tiles, w.blocks
        words = w.qweight.view(torch.int16).view(tiles, blocks * 8, 256)
        w_desc = TensorDescriptor(words, [tiles, blocks * 8, 256], [blocks * 2048, 256, 1], [wg, 8, 256],
                                  _nvmma(torch.int16, 3))
        s = w.scales
        s_desc = TensorDescriptor(s, list(s.shape), [s.shape[1], 1], [1, TILE_N * wg], _nvmma(s.dtype, 2))
        # Without zero points the kernel never reads z_desc; any uint8 view will do.
        z = w.zeros if w.zeros is not None else w.qweight.view(torch.uint8).view(tiles, -1)
        z_desc = TensorDescriptor(z, list(z.shape), [z.stride(0), 1], [1, TILE_N * wg], _nvmma(torch.uint8, 2))
        have = w.runtime[key] = (w_desc, s_desc, z_desc)
    return have


def x_descriptor(x: torch.Tensor, bits: int, bm: int) -> Any:
    """x ``[M, K]`` viewed as ``[K/32, M, 32]``: one box is one block's slices."""
    m, k = x.shape
    pairs = 16 // bits
    swizzle = 64  # a [bm, 32] 16-bit tile: 64-byte rows
    return TensorDescriptor(x, [k // SLICE, m, SLICE], [SLICE, k, 1], [pairs, bm, SLICE],
                            _nvmma(x.dtype, 3, swizzle))


def _counters(w: HopperWeights, tiles: int, device: torch.device) -> torch.Tensor:
    """The split-K arrival counters (int32, zero between launches: the last program of a
    tile resets its own), kept with the weight; grown on demand."""
    return grown(w.runtime, ("counters", device), tiles, torch.int32, device, zero=True, minimum=1024)


class Walk(NamedTuple):
    """How the programs of one launch walk K."""

    #: Blocks per program (the last one may get fewer).
    steps: int
    #: Programs along K.
    split: int
    #: Blocks between two full waits (1 or 2).
    per_wait: int
    #: Whether each block's wgmma groups stay in flight while the next one is dequantized.
    in_flight: bool


def split_steps(w: HopperWeights, plan: Plan) -> Walk:
    """The walk of ``plan`` over ``w``: pairs of blocks (per wait, or in flight) only where
    every program gets an even count, else one block per wait."""
    steps = triton.cdiv(w.blocks, plan.split)
    pairs = w.blocks % 2 == 0
    per_wait = plan.per_wait if pairs else 1
    in_flight = plan.in_flight and pairs
    steps += steps % (2 if per_wait == 2 or in_flight else 1)
    return Walk(steps, triton.cdiv(w.blocks, steps), per_wait, in_flight)


def kernel_args(x: torch.Tensor, w: HopperWeights, plan: Plan, y: torch.Tensor, ws: torch.Tensor,
                counters: torch.Tensor) -> tuple[tuple[int, int], list[Any], dict[str, Any]]:
    """``(grid, positional args, constexprs + launch options)`` of one launch."""
    m = x.shape[0]
    n = w.out_features
    bk = block_k(w.bits)
    steps, split, per_wait, in_flight = split_steps(w, plan)
    w_desc, s_desc, z_desc = weight_descriptors(w, plan.wg)
    tiles = triton.cdiv(n, TILE_N * plan.wg) * triton.cdiv(m, plan.bm)
    bias = w.bias if w.bias is not None else w.scales
    args = [w_desc, x_descriptor(x, w.bits, plan.bm), s_desc, z_desc, bias, y, ws, counters,
            m, n, y.stride(0), w.blocks, steps, split, w.sub_group]
    slices_per_row = (16 // w.bits) if w.sub_group >= bk else w.sub_group // SLICE
    const = dict(BITS=w.bits, ROWS=sub_rows(w), SLICES_PER_ROW=slices_per_row, SPLIT=split > 1,
                 HAS_ZEROS=w.zeros is not None, HAS_BIAS=w.bias is not None, WG=plan.wg, BM=plan.bm,
                 STAGES=plan.stages, PER_WAIT=per_wait, IN_FLIGHT=in_flight,
                 num_warps=plan.num_warps)
    return (tiles, split), args, const


def linear(x2: torch.Tensor, w: HopperWeights, plan: Plan | None = None) -> torch.Tensor:
    """``y = x2 · Ŵᵀ + b`` for ``x2`` [M, K] (already permuted by ret_idx)."""
    m = x2.shape[0]
    n = w.out_features
    plan = plan or plan_of(m, w, x2.device)
    x = prepare_x(x2)
    y = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    split = split_steps(w, plan).split
    if split > 1:
        tiles = triton.cdiv(n, TILE_N * plan.wg) * triton.cdiv(m, plan.bm)
        ws = torch.empty(split * m * n, dtype=torch.float32, device=x2.device)
        counters = _counters(w, tiles, x2.device)
    else:
        ws, counters = w.scales, w.scales
    grid, args, const = kernel_args(x, w, plan, y, ws, counters)
    wgmma_kernel[grid](*args, **const)
    return y
