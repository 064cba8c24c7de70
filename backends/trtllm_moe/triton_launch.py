"""Launching the Triton MoE kernels (:mod:`.triton_source`) for the price of a launch.

A :class:`Bucket` holds what a call of one tile decides once for an expert-weight set:
the constexprs, the fixed arguments, the kernels bound to their launchers
(:class:`quantcore.triton.launch.Launch`). ``triton_kernel.TritonMoE`` keeps buckets with
the weights' layout tensor, by tile (which follows the routes per expert),
power-of-two route count (the kernels' compile-time loop bounds), dtype and variant. A
call is the output allocation and one launch; a tile with the scheduling kernel
(``MoETile.two_launches``) adds the schedule's buffer and that kernel's launch.
Imports triton: loaded on the first call.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from quantcore.triton.launch import Launch, launch_state
from quantcore.triton.unowned import unowned

from .tiles import SCAN_LOG, MoETile, check_tile, pow2_at_least, route_bound
from .triton_source import moe_w8a16_kernel, route_schedule_kernel, schedule_words

__all__ = ["GEMM_VARYING", "Bucket", "launch_state"]

#: The arguments of the GEMM that change between calls of a bucket and that Triton
#: specialises: the activation rows and their stride, the route ids (int32 or int64), the
#: route weights. (Its route counts are not specialised; y and, with the scheduling
#: kernel, the schedule are fresh allocations.)
GEMM_VARYING = (0, 1, 6, 8)
#: The GEMM's weight tensors (index words, scales, zeros): the same objects at every call
#: of a bucket, handed to the launcher as addresses; and its schedule pointer, which holds
#: the index words too unless the scheduling kernel writes a schedule per call.
GEMM_WEIGHTS = (3, 4, 5)
GEMM_SCHEDULE = 7


class Bucket:
    """What a call of one tile launches for one expert-weight set, activation dtype, gated
    or not, weighted or not, and power-of-two count of routes (the kernels' loop bounds):
    the constexprs, the fixed arguments and the kernels bound to their launchers."""

    def __init__(self, prepared: Any, tile: MoETile, routes: int, device: torch.device, *, sms: int,
                 wgmma: bool, interpreted: bool, gated: bool, weighted: bool, x_dtype: torch.dtype) -> None:
        """``prepared``: the kernel's ``TritonMoEWeights``; ``sms``: the device's SM count;
        ``wgmma``: the dots compile to Hopper's asynchronous wgmma (:func:`.tiles.uses_wgmma`);
        ``interpreted``: Triton's interpreter runs the kernels (fp32 dots, no PTX)."""
        e, k, n = prepared.layout.shape
        check_tile(tile, routes, k, prepared.group_size, gated, scale_dtype=prepared.scales.dtype, wgmma=wgmma)
        self.tile, self.e, self.n, self.device = tile, e, n, device
        self.cols = n // 2 if gated else n
        self.n_tiles = -(-self.cols // (tile.bn // 2 if gated else tile.bn))
        self.sms = sms
        # fp32 out when the routes are summed afterwards, and under the interpreter, whose
        # fp32 → bf16 conversion truncates instead of rounding to nearest.
        self.y_dtype = torch.float32 if weighted or interpreted else x_dtype
        # The layout tensor by weak reference: it owns the launch state this is kept in.
        self.source = (weakref.ref(prepared.layout), prepared.scales, prepared.zeros)
        words = unowned(prepared.layout.view(torch.int32))
        zeros = prepared.zeros if prepared.zeros is not None else prepared.scales
        self.weights, self.placeholder = (words, prepared.scales, zeros), prepared.scales
        self.dims = (e, n, self.cols, n // 2, prepared.scales.shape[1])
        e_pad = pow2_at_least(e, 2)
        flags = dict(
            K=k, GROUP=prepared.group_size, BM=tile.bm, BN=tile.bn, BK=tile.bk,
            E_PAD=e_pad, GATED=gated, HAS_RW=weighted,
            SYM=prepared.zeros is None, PRE_SCALE=tile.pre_scale,
            # The interpreter's fma is a rounded multiply then an add (NumPy): not exact there.
            EXACT_FMA=prepared.scales.dtype == torch.bfloat16 and not interpreted,
            ASM=tile.asm and not interpreted, FP32_DOT=interpreted, SCALE_PAIRS=tile.scale_pairs,
            SPLIT_TAIL=tile.split_tail,
        )
        options = dict(num_warps=tile.num_warps, num_stages=tile.num_stages)
        # The interpreter cannot take a run-time loop bound: one program per tile there.
        self.persistent = tile.persistent if tile.scheduled and not interpreted else 0
        self.schedule: Launch | None = None
        if tile.two_launches:
            self.schedule = Launch(route_schedule_kernel, device=device, varying=(0,), options=dict(num_warps=4),
                                   constexprs=dict(R_MAX=pow2_at_least(routes, 16), BM=tile.bm, E_PAD=e_pad,
                                                   CHUNK=max(16, min(1024, 8192 // e_pad)),
                                                   WRITE_TOKENS=tile.x_sorted))
        fixed = GEMM_WEIGHTS if tile.two_launches else (*GEMM_WEIGHTS, GEMM_SCHEDULE)
        self.gemm = Launch(moe_w8a16_kernel, device=device, varying=GEMM_VARYING, options=options,
                           fixed_pointers=fixed, constexprs=dict(
            flags, R_PAD=route_bound(tile, routes), KEYS=pow2_at_least(e + 1, 2), SCAN_LOG=SCAN_LOG,
            SCHEDULED=tile.scheduled, SCHEDULE_KERNEL=tile.two_launches, PERSISTENT=self.persistent > 0,
            X_SORTED=tile.x_sorted))

    def fits(self, prepared: Any) -> bool:
        """Made for these tensors (a state rebuilt around them is the same weight)."""
        s = self.source
        return s[0]() is prepared.layout and s[1] is prepared.scales and s[2] is prepared.zeros

    def __call__(self, x: torch.Tensor, route_ids: torch.Tensor, x_div: int, route_weights: torch.Tensor | None,
                 y: torch.Tensor) -> None:
        """Run the kernel into ``y`` (``R`` contiguous rows of ``cols``): ``x [rows, K]``
        (route r reads row ``r // x_div``), ``route_ids`` the ``R`` int32 or int64 expert ids,
        contiguous; a route whose id lies outside ``[0, E)`` gets a NaN row. No host
        synchronisation."""
        r, e, tile = route_ids.numel(), self.e, self.tile
        rw = route_weights if route_weights is not None else self.placeholder
        # The groups of routes: the experts, and one more for the stray ids (NaN rows).
        groups = min(r, e + 1)
        if not tile.scheduled:
            # The schedule is not read: a fixed int32 stand-in.
            self.gemm((groups, self.n_tiles, 1), x, x.stride(0), x_div, *self.weights, route_ids, self.weights[0], rw,
                      y, self.cols, r, *self.dims, 0, 1)
            return
        bound = (r // tile.bm + groups) * self.n_tiles  # each group adds at most one partial M-tile
        progs = min(bound, self.sms * self.persistent) if self.persistent else bound
        if self.schedule is None:
            # One launch: every program finds its tile's expert and routes in the ids.
            self.gemm((progs, 1, 1), x, x.stride(0), x_div, *self.weights, route_ids, self.weights[0], rw, y,
                      self.cols, r, *self.dims, bound, progs)
            return
        sched = torch.empty(schedule_words(r, e, tile.x_sorted), dtype=torch.int32, device=self.device)
        self.schedule((1, 1, 1), route_ids, sched, r, e, self.n_tiles, x_div)
        xs = x.index_select(0, sched[schedule_words(r, e, False):]) if tile.x_sorted else x
        self.gemm((progs, 1, 1), xs, xs.stride(0), x_div, *self.weights, route_ids, sched, rw, y, self.cols, r,
                  *self.dims, bound, progs)
