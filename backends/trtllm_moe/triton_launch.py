"""Launching the Triton MoE kernels (:mod:`.triton_source`) for the price of a launch.

A :class:`Bucket` holds what a call of one tile decides once for an expert-weight set:
the constexprs, the fixed arguments, the kernels bound to their launchers
(:class:`quantcore.triton.launch.Launch`). ``triton_kernel.TritonMoE`` keeps buckets with
the weights' layout tensor, by tile (which follows the routes per expert) and
power-of-two route count (the kernels' compile-time loop bounds), both read off the
route count in one bisection (``triton_kernel._route_points``), and by dtype and variant. A
call is the output allocation and one launch; a tile with the scheduling kernel
(``MoETile.two_launches``) adds the schedule's buffer and that kernel's launch.
Imports triton: loaded on the first call.
"""

from __future__ import annotations

from typing import Any

import torch

from quantcore.triton.launch import Launch, launch_state
from quantcore.triton.unowned import unowned

from .tiles import SCAN_LOG, MoETile, check_tile, pow2_at_least, route_bound
from .triton_source import moe_w8a16_kernel, route_schedule_kernel, schedule_words

__all__ = ["GEMM_VARYING", "Bucket", "launch_state"]

#: The arguments of the GEMM that change between calls of a bucket and that Triton
#: specialises: the activation rows and their stride, the route ids (int32 or int64), and
#: in a weighted bucket the caller's route weights. (Its route counts are not specialised;
#: y and, with the scheduling kernel, the schedule are fresh allocations.)
GEMM_VARYING = (0, 1, 6)
GEMM_ROUTE_WEIGHTS = 8
#: The GEMM's weight tensors (index words, scales, zeros): the same objects at every call
#: of a bucket, handed to the launcher as addresses; and its schedule pointer, which holds
#: the index words too unless the scheduling kernel writes a schedule per call, and, in a
#: bucket without route weights, the scales in their place.
GEMM_WEIGHTS = (3, 4, 5)
GEMM_SCHEDULE = 7
#: The GEMM's output: the bucket's own allocation, handed to the launcher as an address.
GEMM_OUT = 9


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
        # fp32 out when the routes are summed afterwards, and under the interpreter, whose
        # fp32 → bf16 conversion truncates instead of rounding to nearest.
        self.y_dtype = torch.float32 if weighted or interpreted else x_dtype
        #: Whether an unweighted call's output is rounded to the activation dtype after the launch.
        self.rounds = self.y_dtype != x_dtype
        # The weight's tensors this bucket was made for beside the layout (which owns the
        # launch state it is kept in): a state rebuilt around the same tensors is the same weight.
        self.scales, self.zeros = prepared.scales, prepared.zeros
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
        persistent = tile.persistent if tile.scheduled and not interpreted else 0
        #: The most programs a scheduled launch runs (None: one per tile).
        self.max_programs = sms * persistent if persistent else None
        self.scheduled, self.bm, self.groups = tile.scheduled, tile.bm, e + 1  # the experts and the stray ids
        self.schedule: Launch | None = None
        if tile.two_launches:
            self.schedule = Launch(route_schedule_kernel, device=device, varying=(0,), own_pointers=(1,),
                                   options=dict(num_warps=4),
                                   constexprs=dict(R_MAX=pow2_at_least(routes, 16), BM=tile.bm, E_PAD=e_pad,
                                                   CHUNK=max(16, min(1024, 8192 // e_pad)),
                                                   WRITE_TOKENS=tile.x_sorted))
        fixed = GEMM_WEIGHTS if tile.two_launches else (*GEMM_WEIGHTS, GEMM_SCHEDULE)
        own = (GEMM_SCHEDULE, GEMM_OUT) if tile.two_launches else (GEMM_OUT,)
        self.gemm = Launch(moe_w8a16_kernel, device=device, options=options,
                           varying=(*GEMM_VARYING, GEMM_ROUTE_WEIGHTS) if weighted else GEMM_VARYING,
                           fixed_pointers=fixed if weighted else (*fixed, GEMM_ROUTE_WEIGHTS), own_pointers=own,
                           constexprs=dict(
            flags, R_PAD=route_bound(tile, routes), KEYS=pow2_at_least(e + 1, 2), SCAN_LOG=SCAN_LOG,
            SCHEDULED=tile.scheduled, SCHEDULE_KERNEL=tile.two_launches, PERSISTENT=persistent > 0,
            X_SORTED=tile.x_sorted))

    def __call__(self, x: torch.Tensor, x_stride: int, route_ids: torch.Tensor, r: int, x_div: int,
                 route_weights: torch.Tensor | None, y: torch.Tensor) -> None:
        """Run the kernel into ``y`` (``r`` contiguous rows of ``cols``): ``x [rows, K]``
        (rows ``x_stride`` apart; route i reads row ``i // x_div``), ``route_ids`` the ``r``
        int32 or int64 expert ids, contiguous; a route whose id lies outside ``[0, E)`` gets
        a NaN row. No host synchronisation."""
        rw = route_weights if route_weights is not None else self.placeholder
        # The groups of routes: the experts, and one more for the stray ids (NaN rows).
        groups = min(r, self.groups)
        if not self.scheduled:
            # The schedule is not read: a fixed int32 stand-in.
            self.gemm((groups, self.n_tiles, 1), x, x_stride, x_div, *self.weights, route_ids, self.weights[0], rw,
                      y, self.cols, r, *self.dims, 0, 1)
            return
        bound = (r // self.bm + groups) * self.n_tiles  # each group adds at most one partial M-tile
        progs = bound if self.max_programs is None else min(bound, self.max_programs)
        if self.schedule is None:
            # One launch: every program finds its tile's expert and routes in the ids.
            self.gemm((progs, 1, 1), x, x_stride, x_div, *self.weights, route_ids, self.weights[0], rw, y,
                      self.cols, r, *self.dims, bound, progs)
            return
        e, x_sorted = self.e, self.tile.x_sorted
        sched = torch.empty(schedule_words(r, e, x_sorted), dtype=torch.int32, device=self.device)
        self.schedule((1, 1, 1), route_ids, sched, r, e, self.n_tiles, x_div)
        xs = x.index_select(0, sched[schedule_words(r, e, False):]) if x_sorted else x
        self.gemm((progs, 1, 1), xs, xs.stride(0), x_div, *self.weights, route_ids, sched, rw, y, self.cols, r,
                  *self.dims, bound, progs)
