"""Calls of a :class:`~.plans.DecodePlan`: the warp-level decode kernel (``decode.py``) over
``hopper_wgmma``'s own prepared words, bound once per weight, activation dtype and plan
(kept by ``launch.py`` with the weight, as the other buckets). Per call: x, M, the output,
the split-K workspace; the grid is the weight's 64-row tiles times the split.

A TurboQuant layer's bucket may rotate x in the same launch (``rotation``:
``rotation_programs.py``): its call takes the layer's x, and adds the rotated x's workspace,
the counts and the rotation programs' rows of the grid.
"""

from __future__ import annotations

import torch

from quantcore.errors import KernelInputError
from quantcore.tensors import describe
from quantcore.triton.launch import Launch
from quantcore.triton.rotation_workspace import rotation_buffers
from quantcore.triton.split_k import SplitKBuffers
from quantcore.triton.unowned import unowned

from .decode import decode_grid, decode_kernel, whole_runs
from .layout import HopperWeights, LookupWeights, bound_to, weight_source
from .plans import DecodePlan
from .rotation_programs import Rotation, rotation_constexprs, rotation_rows
from .small_m import close_slices

__all__ = ["DecodeBucket"]

#: Arguments that change between the calls of one bucket and that Triton specialises: x
#: (its alignment) and M (== 1).
VARYING = (1, 8)
#: The weight's words, scales, zero points and bias (the scales in the place of those it
#: lacks); the split-K workspace and counters when K is not split: the same objects at
#: every call of a bucket, handed to the launcher as addresses.
FIXED = (0, 2, 3, 4)
SPLIT_K_BUFFERS = (6, 7)
#: A rotating bucket's layer x, the counts and the rotation programs' rows of the grid (x
#: in position 1 is then the rotated x's kept workspace); and its rotation, the same
#: tensor at every call (a layer whose rotation was replaced binds it again: the launch
#: takes another object there through Triton's own path). Without a rotation the three
#: pointers are fixed stand-ins.
ROTATION_VARYING = (16, 18, 19)
ROTATION_FIXED = (17,)
ROTATION_POINTERS = (16, 17, 18)


class DecodeBucket:
    """One decode plan of one weight for one activation dtype and device; ``gated``: its
    tiles end with ``silu(gate) · up`` (``launch.gated_linear``)."""

    #: The twin bucket of gated calls, made by ``launch.gated_linear`` on the first.
    gated: DecodeBucket | bool | None = None
    #: The twin bucket that rotates x in its launch, made by ``turboquant_launch.py`` on the
    #: first call of a TurboQuant layer; False where the rotation cannot run there.
    rotated: DecodeBucket | bool | None = None

    def __init__(self, w: HopperWeights, dtype: torch.dtype, device: torch.device, plan: DecodePlan, *,
                 gated: bool = False, rotation: Rotation | None = None) -> None:
        self.plan, self.dtype, self.device = plan, dtype, device
        #: The weight's tensors as bound: a state whose fields were replaced is bound again.
        #: The packed tensor by weak reference: it owns the launch state this is kept in.
        self.source = weight_source(w)
        k, n = w.in_features, w.out_features
        self.n, self.k, self.tiles = n, k, w.tiles
        self.out = n // 2 if gated else n
        steps, self.split = decode_grid(w.blocks, plan.split, 1)
        any_t = w.scales
        self.split_k = SplitKBuffers(self.split, device, any_t, always=gated)
        const = dict(BITS=w.bits, SG=w.sub_group, CLOSE=close_slices(w), HAS_ZEROS=w.zeros is not None,
                     HAS_BIAS=w.bias is not None, SPLIT=self.split > 1, EVEN_K=whole_runs(k, w.bits, w.blocks, steps, 1), KW=1,
                     STEPS=steps, READ_ONLY=0, DEPTH=2, ROWS=plan.bm, LOOKUP=isinstance(w, LookupWeights),
                     GATED=gated, **rotation_constexprs(rotation))
        split_k = SPLIT_K_BUFFERS if self.split <= 1 and not gated else ()
        varying, fixed = VARYING, FIXED + split_k + ROTATION_POINTERS
        if rotation is not None:
            varying, fixed = VARYING + ROTATION_VARYING, FIXED + split_k + ROTATION_FIXED
            self.rhs, self.operand = rotation.source, rotation.operand
            self.groups = k // rotation.cols  # groups of the layer: its x is [M, groups·d]
        self.launch = Launch(decode_kernel, device=device, varying=varying, constexprs=const,
                             fixed_pointers=fixed, options=dict(num_warps=4))
        self.words = unowned(w.qweight.view(torch.int16))
        # A codebook weight's table is read where zero points would be (it has none, nor a bias).
        zeros = w.codebook if isinstance(w, LookupWeights) else w.zeros if w.zeros is not None else any_t
        self.mid = (w.scales, zeros, w.bias if w.bias is not None else any_t)
        # N, K, stride_xm (x is contiguous), stride_ym, scale rows' length, blocks, split
        self.tail = (n, k, k, self.out, w.scales.shape[1], w.blocks, self.split)
        # Without a rotation: its x, rotation, counts (stand-ins) and no rotation rows.
        self.unrotated = (*self.tail, any_t, any_t, any_t, 0)

    def fits(self, w: HopperWeights) -> bool:
        return bound_to(self.source, w)

    def __call__(self, x: torch.Tensor, w: HopperWeights, m: int) -> torch.Tensor:
        """``y = x · Ŵᵀ + b`` ``[..., N]`` (gated: ``[..., N/2]``) for the ``m`` (at most the
        plan's ``bm``) rows of ``x`` ``[..., K]`` of this bucket's dtype."""
        if x.dtype != self.dtype:
            raise KernelInputError(f"x: expected {self.dtype}, got {describe(x)}")
        if not 1 <= m <= self.plan.bm:
            raise KernelInputError(f"x: this decode plan takes 1 to {self.plan.bm} rows, got {m} ({describe(x)})")
        x = x.contiguous()  # the launch passes K as the row stride
        n = self.n
        # The sizes as arguments, not one tuple: torch parses them faster (docs/triton-launch.md).
        y = torch.empty(*x.shape[:-1], self.out, dtype=self.dtype, device=self.device)
        ws, counters = self.split_k(m, n, self.tiles)
        self.launch((self.tiles, self.split, 1), self.words, x, *self.mid, y, ws, counters, m, *self.unrotated)
        return y

    def rotating(self, x: torch.Tensor, m: int) -> torch.Tensor:
        """``y`` ``[m, N]`` of a rotating bucket for the layer's x ``[m, K/passes]``
        (contiguous, this bucket's dtype; the caller checks): x rotated by this launch's
        rotation programs into the kept workspace, which its other programs read."""
        y = torch.empty(m, self.out, dtype=self.dtype, device=self.device)
        ws, counters = self.split_k(m, self.n, self.tiles)
        xr, counts = rotation_buffers(self.device, m * self.k, self.dtype)
        rows = rotation_rows(m, self.groups, self.tiles)
        self.launch((self.tiles, rows + self.split, 1), self.words, xr, *self.mid, y, ws, counters, m, *self.tail,
                    x, self.operand, counts, rows)
        return y
