"""Small-M calls through the Triton kernels over ``hopper_wgmma``'s own prepared state.

At a few activation rows a call streams the weight once and its time is the stream's
plus the launch's; the wgmma kernel's TMA ring and split-K reduction cost more there
than Triton's GEMV or tensor-core kernel
(``quantcore/kernels/gptq_pairs/triton_kernels.py``). Those kernels read the fragment
order of ``layout.py`` directly (their ``FRAGMENTS`` constexpr: the word of each row's
block, and scales and zero points per sub-group with rows padded to 64), so one prepared
layout serves every M and no second copy of the weight exists. A call takes this path
only when its plan is a :class:`~.plans.TritonPlan` (a tuned table's choice, or a probe's).

What depends only on the weight, the activation dtype and the plan is bound once
(:class:`SmallMBucket`, kept by ``launch.py`` with the weight); per call: x, M, the
output, the split-K workspace and the grid.
"""

from __future__ import annotations

import os

import torch
import triton

from quantcore.errors import KernelInputError
from quantcore.kernels.gptq_pairs.layout import block_k, pairs
from quantcore.kernels.gptq_pairs.triton_kernels import gemv_kernel, launch_grid, mma_kernel
from quantcore.tensors import describe
from quantcore.triton.launch import Launch
from quantcore.triton.split_k import SplitKBuffers
from quantcore.triton.unowned import unowned

from .layout import HopperWeights, LookupWeights, bound_to, weight_source
from .plans import TritonPlan

__all__ = ["SmallMBucket", "close_slices"]

#: Arguments that change between the calls of one bucket and that Triton specialises:
#: x (its alignment) and M (== 1, divisible by 16).
VARYING = (0, 9)
#: The weight's tensors (``self.fixed``), and the split-K workspace and counters when K is
#: not split (the scales stand in for them): the same objects at every call of a bucket,
#: handed to the launcher as addresses.
FIXED = (1, 2, 3, 4, 5)
SPLIT_K_BUFFERS = (7, 8)


def close_slices(w: HopperWeights) -> int:
    """Slices between two reads of a scale row: a block's slices share one row when
    sub-groups span whole blocks; sub-groups that split a block (``layout.py`` allows no
    other) take a row every ``SG/32`` slices."""
    bk = block_k(w.bits)
    return pairs(w.bits) if w.sub_group % bk == 0 else w.sub_group // 32


class SmallMBucket:
    """One Triton plan of one weight for one activation dtype and device."""

    #: Its calls never end gated (``launch.gated_refusal``): set to False on the first ask.
    gated: bool | None = None

    def __init__(self, w: HopperWeights, dtype: torch.dtype, device: torch.device, plan: TritonPlan) -> None:
        self.plan, self.dtype, self.device = plan, dtype, device
        #: The weight's tensors as bound: a state whose fields were replaced is bound again.
        #: The packed tensor by weak reference: it owns the launch state this is kept in.
        self.source = weight_source(w)
        k, n = w.in_features, w.out_features
        self.n = n
        any_t = w.scales
        if isinstance(w, LookupWeights):
            raise KernelInputError(f"plan: a codebook weight runs the wgmma and decode kernels only, got {plan}")
        interpreting = os.environ.get("TRITON_INTERPRET") == "1"
        if plan.path == "mma" and interpreting and plan.operand != 0:
            # The interpreter's bf16 dot is wrong (docs/triton-interpreter.md): refuse, never a wrong result.
            raise KernelInputError(f"plan: Triton's interpreter runs the mma path with operand 0 only, got {plan}")
        # HAS_MAP False: the fragment order's scale rows are the sub-groups themselves.
        const = dict(BITS=w.bits, SG=w.sub_group, CLOSE=close_slices(w), BLOCKS=w.blocks,
                     HAS_ZEROS=w.zeros is not None, HAS_MAP=False, HAS_BIAS=w.bias is not None,
                     EVEN_K=k % block_k(w.bits) == 0, EVEN_N=n % plan.block_n == 0, ASM=not interpreting,
                     BLOCK_N=plan.block_n, FRAGMENTS=True)
        if plan.path == "gemv":
            kernel, weight, block_m = gemv_kernel, unowned(w.qweight), 1
        else:
            kernel, weight, block_m = mma_kernel, unowned(w.qweight.view(torch.int16)), plan.block_m
            const |= dict(BLOCK_M=plan.block_m, OPERAND=plan.operand)
        self.steps = triton.cdiv(triton.cdiv(w.blocks, plan.split), plan.block_b)
        self.split = triton.cdiv(w.blocks, self.steps * plan.block_b)
        self.split_k = SplitKBuffers(self.split, device, any_t)
        self.block_m = block_m
        self.n_tiles = triton.cdiv(n, plan.block_n)
        self.launch = Launch(kernel, device=device, varying=VARYING,
                             fixed_pointers=FIXED + (SPLIT_K_BUFFERS if self.split <= 1 else ()),
                             constexprs=dict(const, BLOCK_B=plan.block_b, SPLIT_K=self.split, STEPS=self.steps),
                             options=dict(num_warps=plan.num_warps, num_stages=plan.stages))
        zeros = w.zeros if w.zeros is not None else any_t
        self.fixed = (weight, w.scales, zeros, any_t, w.bias if w.bias is not None else any_t)
        # N, K, stride_xm (x is contiguous), stride_ym, rows of scales, group-map length (unused)
        self.tail = (n, k, k, n, w.scales.shape[0], 1)

    def fits(self, w: HopperWeights) -> bool:
        return bound_to(self.source, w)

    def __call__(self, x: torch.Tensor, w: HopperWeights, m: int) -> torch.Tensor:
        """``y = x · Ŵᵀ + b`` ``[..., N]`` for the ``m`` rows of ``x`` ``[..., K]`` of this
        bucket's dtype."""
        if x.dtype != self.dtype:
            raise KernelInputError(f"x: expected {self.dtype}, got {describe(x)}")
        x = x.contiguous()  # the launch passes K as the row stride
        n = self.n
        # The sizes as arguments, not one tuple: torch parses them faster (docs/triton-launch.md).
        y = torch.empty(*x.shape[:-1], n, dtype=self.dtype, device=self.device)
        grid, tiles = launch_grid(self.plan.path, m, self.n_tiles, self.block_m, self.split)
        ws, counters = self.split_k(m, n, tiles)
        self.launch(grid, x, *self.fixed, y, ws, counters, m, *self.tail)
        return y
