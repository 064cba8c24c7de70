"""Launching the kernels: the plan (configs.py), the grid, the split-K buffers, and the
dequantize-into-a-scratch + cuBLAS path. Imports triton (through quantcore/kernels/gptq_pairs/triton_kernels.py): load it
only when a call runs.

What depends only on the weight, the activation dtype and the plan is decided once and
kept with the weight's packed tensor (:class:`_Bucket`, through
:func:`quantcore.triton.launch.launch_state`): the constexprs, the fixed arguments, the
split, the compiled kernel bound to its launcher (:class:`quantcore.triton.launch.Launch`).
The plan itself changes with M only at the breaks of :func:`.configs.plan_breaks`, so a
call finds its bucket by bisecting those. Per call: the activation's pointer and M (the
arguments Triton specialises that change), the output, the split-K workspace, the grid.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import weakref
from typing import Any

import torch
import triton

from quantcore.errors import KernelInputError
from quantcore.kernels.gptq_pairs.layout import SLICE, block_k, pairs
from quantcore.kernels.gptq_pairs.triton_kernels import (
    dequant_kernel,
    gemv_kernel,
    launch_grid,
    mma_kernel,
)
from quantcore.probe.card_tables import cuda_card
from quantcore.tensors import describe
from quantcore.triton.buffers import KeptBuffers, stream_key
from quantcore.triton.launch import Launch, launch_state
from quantcore.triton.split_k import SplitKBuffers
from quantcore.triton.unowned import unowned

from .configs import DEQUANT_BLOCK_N, INTERPRETER_MMA, Plan, Shape, plan_breaks, plan_for
from .layout import TritonIntWeights

__all__ = ["close_slices", "interpreting", "linear", "plan_of"]

#: The arguments of the GEMV and MMA kernels that change from call to call within a
#: bucket and that Triton specialises: x (its alignment) and M (== 1, divisible by 16).
#: y and the workspace are fresh allocations (aligned); the rest is the weight's.
VARYING = (0, 9)
#: The weight's tensors in the GEMV and MMA kernels' arguments (``self.fixed``): the same
#: objects at every call of a bucket, handed to the launcher as addresses.
FIXED = (1, 2, 3, 4, 5)
#: The split-K workspace and counters: the weight's scales in their place when K is not split.
SPLIT_K_BUFFERS = (7, 8)
#: The dequantization kernel's weight tensors (its output is the shared scratch).
DEQUANT_FIXED = (0, 1, 2, 3)
#: Under the interpreter, the MMA tile height follows M up to 64 (plan_of).
INTERPRETER_BREAKS = (17, 33)


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


def _shape(m: int, dtype: torch.dtype, w: TritonIntWeights) -> Shape:
    return Shape(m, w.in_features, w.out_features, w.bits, close_slices(w), _dtype_name(dtype))


def plan_of(x2: torch.Tensor, w: TritonIntWeights) -> Plan:
    m = x2.shape[0]
    if interpreting():
        # The path the GPU runs at every M (the GEMV only when a plan names it), with fp32
        # operands and few, large programs.
        block_m = max(16, min(64, 1 << (m - 1).bit_length()))
        return Plan("mma", mma=dataclasses.replace(INTERPRETER_MMA, block_m=block_m))
    return plan_for(_shape(m, x2.dtype, w), cuda_card(x2.device))


def _breaks(x2: torch.Tensor, w: TritonIntWeights) -> tuple[int, ...]:
    if interpreting():
        return INTERPRETER_BREAKS
    return plan_breaks(_shape(1, x2.dtype, w), cuda_card(x2.device))


#: One dequantization scratch per (device, stream, dtype), shared by every layer and grown
#: to the largest: the dense weight exists only while one call runs, and the next call on
#: the stream writes it only after the matmul that reads it. Two streams never share one
#: (two micro-batches' prefill run at once would overwrite each other's weight).
_SCRATCH = KeptBuffers(None, zero=False)


def _scratch_for(device: torch.device, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """The dense weight's scratch: on CUDA the stream's kept one; elsewhere (Triton's
    interpreter on a CPU, where two threads may run calls at once) the call's own."""
    if device.type != "cuda":
        return torch.empty(numel, dtype=dtype, device=device)
    return _SCRATCH.get((*stream_key(device), dtype), numel, device, dtype)[:numel]


def _common(w: TritonIntWeights) -> dict[str, Any]:
    return dict(
        NUM_GROUPS=w.num_groups,
        NUM_SUB=w.group_map.numel() if w.group_map is not None else 1,
        BITS=w.bits, SG=w.sub_group, BLOCKS=w.blocks,
        HAS_ZEROS=w.zeros is not None, HAS_MAP=w.group_map is not None,
    )


class _Bucket:
    """One plan of one weight for one activation dtype and device: everything a call of
    that plan launches that does not depend on the activation."""

    def __init__(self, w: TritonIntWeights, dtype: torch.dtype, device: torch.device, plan: Plan) -> None:
        self.plan, self.dtype, self.device = plan, dtype, device
        #: The weight's tensors as bound: a state whose fields were replaced is bound again.
        #: The packed tensor by weak reference: it owns the launch state this is kept in.
        self.source = (weakref.ref(w.qweight), w.scales, w.zeros, w.group_map, w.bias)
        k, n = w.in_features, w.out_features
        self.n = n
        any_t = w.scales
        zeros = w.zeros if w.zeros is not None else any_t
        gmap = w.group_map if w.group_map is not None else any_t
        common = _common(w)
        runtime = (common.pop("NUM_GROUPS"), common.pop("NUM_SUB"))
        if plan.path == "dequant":
            self.launch = Launch(dequant_kernel, constexprs=dict(**common, BLOCK_N=DEQUANT_BLOCK_N),
                                 fixed_pointers=DEQUANT_FIXED, device=device)
            self.grid = (triton.cdiv(n, DEQUANT_BLOCK_N), w.blocks, 1)
            self.fixed = (unowned(w.qweight.view(torch.int16)), w.scales, zeros, gmap)
            self.tail = (n, k, *runtime)
            self.bias = w.bias.to(dtype) if w.bias is not None else None
            return
        flags = dict(CLOSE=close_slices(w), HAS_BIAS=w.bias is not None, EVEN_K=k % block_k(w.bits) == 0,
                     ASM=not interpreting(), FRAGMENTS=False)
        if plan.path == "gemv":
            cfg: Any = plan.gemv
            tiles_args = dict(BLOCK_N=cfg.block_n, BLOCK_B=cfg.block_b)
            kernel, weight = gemv_kernel, unowned(w.qweight)
        else:
            cfg = plan.mma
            tiles_args = dict(BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m, BLOCK_B=cfg.block_b, OPERAND=cfg.operand)
            kernel, weight = mma_kernel, unowned(w.qweight.view(torch.int16))
        self.steps = triton.cdiv(triton.cdiv(w.blocks, cfg.split_k), cfg.block_b)
        self.split = triton.cdiv(w.blocks, self.steps * cfg.block_b)
        self.split_k = SplitKBuffers(self.split, device, any_t)
        self.block_n, self.block_m = cfg.block_n, getattr(cfg, "block_m", 1)
        self.n_tiles = triton.cdiv(n, cfg.block_n)
        self.launch = Launch(
            kernel, device=device, varying=VARYING,
            fixed_pointers=FIXED + (SPLIT_K_BUFFERS if self.split <= 1 else ()),
            constexprs=dict(**common, **flags, SPLIT_K=self.split, STEPS=self.steps, **tiles_args,
                            EVEN_N=n % cfg.block_n == 0),
            options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        )
        self.fixed = (weight, w.scales, zeros, gmap, w.bias if w.bias is not None else any_t)
        self.tail = (n, k, k, n, *runtime)  # N, K, stride_xm (x is contiguous), stride_ym, groups

    def fits(self, w: TritonIntWeights) -> bool:
        s = self.source
        return (s[0]() is w.qweight and s[1] is w.scales and s[2] is w.zeros and s[3] is w.group_map
                and s[4] is w.bias)

    def __call__(self, x2: torch.Tensor, w: TritonIntWeights) -> torch.Tensor:
        """``y = x2 · Ŵᵀ + b`` for a contiguous ``x2`` [M, K] of this bucket's dtype."""
        m, n = x2.shape[0], self.n
        if self.plan.path == "dequant":
            dense = _scratch_for(self.device, self.dtype, n * x2.shape[1]).view(n, -1)
            self.launch(self.grid, *self.fixed, dense, *self.tail)
            return torch.nn.functional.linear(x2, dense, self.bias)
        # The sizes as arguments, not one tuple: torch parses them faster (docs/triton-launch.md).
        y = torch.empty(m, n, dtype=self.dtype, device=self.device)
        grid, tiles = launch_grid(self.plan.path, m, self.n_tiles, self.block_m, self.split)
        ws, counters = self.split_k(m, n, tiles)
        self.launch(grid, x2, *self.fixed, y, ws, counters, m, *self.tail)
        return y


class _Buckets:
    """A weight's buckets for one activation dtype and device, by run of M (``breaks``)."""

    def __init__(self, breaks: tuple[int, ...]) -> None:
        self.breaks = breaks
        self.by_run: dict[int, _Bucket] = {}
        self.by_plan: dict[Plan, _Bucket] = {}


def _buckets(x2: torch.Tensor, w: TritonIntWeights) -> _Buckets:
    # Kept with the packed weight tensor, not the state object: the custom op rebuilds the
    # state object around the same tensors at every call.
    state = launch_state(w.qweight)
    key = (x2.dtype, x2.device)
    found = state.get(key)
    if found is None:
        found = state[key] = _Buckets(_breaks(x2, w))
    return found  # type: ignore[no-any-return]


def linear(x2: torch.Tensor, w: TritonIntWeights, plan: Plan | None = None) -> torch.Tensor:
    """``y = x2 · Ŵᵀ + b`` for a contiguous ``x2`` [..., K] (already permuted by ret_idx),
    ``[..., N]``; ``plan`` overrides the choice (tests, the tile probe)."""
    if not x2.is_contiguous():  # the bound launch passes K as the row stride
        raise KernelInputError(f"x2: expected a contiguous [M, K], got {describe(x2)} with strides {x2.stride()}")
    if x2.dim() != 2:  # the buckets take [M, K]
        return linear(x2.view(-1, x2.shape[-1]), w, plan).view(*x2.shape[:-1], w.out_features)
    buckets = _buckets(x2, w)
    if plan is None:
        run = bisect.bisect_right(buckets.breaks, x2.shape[0])
        bucket = buckets.by_run.get(run)
        if bucket is None or not bucket.fits(w):
            bucket = buckets.by_run[run] = _Bucket(w, x2.dtype, x2.device, plan_of(x2, w))
    else:
        bucket = buckets.by_plan.get(plan)
        if bucket is None or not bucket.fits(w):
            bucket = buckets.by_plan[plan] = _Bucket(w, x2.dtype, x2.device, plan)
    return bucket(x2, w)
