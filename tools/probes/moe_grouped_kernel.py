"""A grouped launch of ``hopper_wgmma``'s kernel over the experts of an MoE (a probe, not
shipped): one launch multiplies every expert's routed rows by that expert's weight.

The routes are sorted by expert (``moe_grouped_schedule.py``, on the device: nothing waits
for the GPU, so a call records into a CUDA graph); each row tile of ``BM`` routes lies
inside one expert. Program ``pid`` reads its slot — ``(expert, first route, end of the expert's
routes)`` — and its N-tile from a table in the order one launch per expert would run them;
a program past the last tile finds an empty slot and returns at once. The experts' prepared words are stacked along the
tiles and their scale rows along N, so the kernel's own TMA loads (``kernels._issue``) read
expert e's block at tile ``e · tiles + n-tile`` and scale column ``e · Np + n0``; the
sorted activations are x's descriptor as the plain kernel has it (a tile's rows past its
expert's end are multiplied by the wrong weight and never stored). The walk is the plain
kernel's in-flight walk, or its warp-specialised one (``WS``), over all of K (no split).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
)

from quantcore.backends.hopper_wgmma.kernels import (
    _fill,
    _in_flight,
    _mma_layout,
    _ring,
    _slots,
    _words_layout,
    _ws_consume,
    _ws_produce,
)
from quantcore.backends.hopper_wgmma.launch import (
    Walk,
    _constexprs,
    prepare_x,
    weight_descriptors,
    x_descriptor,
)
from quantcore.backends.hopper_wgmma.layout import TILE_N, HopperWeights
from quantcore.backends.hopper_wgmma.plans import Plan
from quantcore.errors import InvalidArgumentError
from quantcore.triton.gluon_split_k import store_layout

from .moe_grouped_schedule import Schedule, Tables

__all__ = ["GroupedExperts", "gated_columns", "grouped_kernel", "stacked"]


@gluon.jit
def grouped_kernel(
    w_desc, x_desc, s_desc, z_desc, y_ptr, slots_ptr, programs_ptr, rows_ptr,
    N, stride_ym, blocks, sub_group, tiles_per_expert, n_pad,
    BITS: gl.constexpr, ROWS: gl.constexpr, SLICES_PER_ROW: gl.constexpr, HAS_ZEROS: gl.constexpr,
    WG: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr = False,
    SCATTER: gl.constexpr = False, GATED: gl.constexpr = False,
):
    """``y[r] = x[r]·Ŵ_eᵀ`` for every sorted route r of every slot's expert e. ``w_desc``:
    the experts' words stacked ``[E·tiles, blocks·8, 256]``; ``s_desc``/``z_desc``: their
    scale and zero-point rows side by side ``[subs, E·Np]``; ``x_desc``: the sorted
    activations as ``[K/32, R, 32]``; ``slots_ptr``, ``programs_ptr``: the schedule's
    tables (``moe_grouped_schedule.Tables``). ``SCATTER``: sorted route r's row is stored at
    row ``rows_ptr[r]`` of y (the route order: the schedule's ``order``), else at row r.
    ``GATED``: the weight's columns in :func:`gated_columns`' order, and y ``[R, N/2]`` the
    SwiGLU of each pair in float32, rounded once."""
    PAIRS: gl.constexpr = 16 // BITS
    BK: gl.constexpr = 32 * PAIRS
    BN: gl.constexpr = 64 * WG
    NUM_WARPS: gl.constexpr = 4 * WG
    act: gl.constexpr = x_desc.dtype
    mma_layout: gl.constexpr = _mma_layout(WG, BM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    words_layout: gl.constexpr = _words_layout(WG)

    pid = gl.program_id(0)
    slot = gl.load(programs_ptr + 2 * pid)
    pid_n = gl.load(programs_ptr + 2 * pid + 1)
    expert = gl.load(slots_ptr + 3 * slot)
    m0 = gl.load(slots_ptr + 3 * slot + 1)
    m_end = gl.load(slots_ptr + 3 * slot + 2)
    if m0 >= m_end:
        return
    tile_n = expert * tiles_per_expert + pid_n * WG
    n0 = pid_n * BN
    s_col = expert * n_pad + n0
    n_iter = blocks
    gl.assume(n_iter > 0)

    S_PAD: gl.constexpr = _slots(s_desc.block_type.nbytes)
    Z_PAD: gl.constexpr = _slots(z_desc.block_type.nbytes)
    w_smem, x_smem, s_smem, z_smem, bar, empty = _ring(w_desc, x_desc, s_desc, z_desc, STAGES, PAIRS, ROWS,
                                                       HAS_ZEROS, BM, WS)
    fence_async_shared()

    acc = gl.zeros([BN, BM], gl.float32, mma_layout)
    if WS:
        acc = gl.warp_specialize(
            [(_ws_consume, (acc, w_smem, x_smem, s_smem, z_smem, bar, empty, n_iter, STAGES, PAIRS, ROWS,
                            SLICES_PER_ROW, BITS, HAS_ZEROS, S_PAD, Z_PAD, WG, BN, act, mma_layout, a_layout,
                            words_layout)),
             (_ws_produce, (w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, empty, n_iter,
                            0, tile_n, m0, s_col, sub_group, STAGES, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD))],
            [1], [24])[0]
    else:
        _fill(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, n_iter, 0, tile_n, m0, s_col,
              sub_group, STAGES, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD)
        acc = _in_flight(acc, w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, n_iter, 0,
                         tile_n, m0, s_col, sub_group, STAGES, PAIRS, ROWS, SLICES_PER_ROW, BITS, HAS_ZEROS, S_PAD,
                         Z_PAD, WG, BN, BK, act, mma_layout, a_layout, words_layout)
    for st in gl.static_range(STAGES):
        mbarrier.invalidate(bar.index(st))
        if WS:
            mbarrier.invalidate(empty.index(st))
    if GATED:
        # Rows 2j and 2j + 1 of the weight are output j's linear and gate columns
        # (gated_columns): each thread of the store layout holds 8 consecutive rows, so
        # the pairs split in registers.
        h = gl.convert_layout(acc, store_layout(BN, BM, NUM_WARPS))
        lin, gate = gl.split(gl.permute(gl.reshape(h, [BN // 2, 2, BM]), [0, 2, 1]))
        out = gl.convert_layout(lin * (gate / (1.0 + gl.exp(-gate))), store_layout(BN // 2, BM, NUM_WARPS))
        _store(out, n0 // 2, m0, m_end, y_ptr, rows_ptr, N // 2, stride_ym, SCATTER, BN // 2, BM, NUM_WARPS)
    else:
        out = gl.convert_layout(acc, store_layout(BN, BM, NUM_WARPS))
        _store(out, n0, m0, m_end, y_ptr, rows_ptr, N, stride_ym, SCATTER, BN, BM, NUM_WARPS)


@gluon.jit
def _store(out, n0, m0, m_end, y_ptr, rows_ptr, N, stride_ym, SCATTER: gl.constexpr, BN: gl.constexpr,
           BM: gl.constexpr, NUM_WARPS: gl.constexpr):
    """Columns ``n0…`` of the tile's routes ``m0…m_end`` (``out`` ``[BN, BM]`` in the store
    layout) into y: sorted route r at row ``rows_ptr[r]`` (``SCATTER``) or at row r."""
    out_layout: gl.constexpr = store_layout(BN, BM, NUM_WARPS)
    offs_n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, out_layout))
    offs_m = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, out_layout))
    live = offs_m < m_end
    if SCATTER:
        rows = gl.load(rows_ptr + offs_m, mask=live, other=0).to(gl.int64)
    else:
        rows = offs_m.to(gl.int64)
    mask = gl.expand_dims(offs_n < N, 1) & gl.expand_dims(live, 0)
    gl.store(y_ptr + gl.expand_dims(rows * stride_ym, 0) + gl.expand_dims(offs_n, 1), out.to(y_ptr.dtype.element_ty),
             mask=mask)


def gated_columns(n: int) -> torch.Tensor:
    """The column order of a gated weight ``[K, 2·I]`` (linear half first, gate half second,
    as ``quantcore.ops.moe.reference.swiglu``) that the ``GATED`` epilogue reads: linear
    column j at 2j, gate column j at 2j + 1."""
    inter = n // 2
    return torch.stack([torch.arange(inter), torch.arange(inter) + inter], 1).reshape(-1)


def stacked(experts: list[Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The experts' prepared words stacked along the tiles, and their scale (and zero-point)
    rows side by side: ``(words [E·tiles, …], scales [subs, E·Np], zeros or None)``."""
    words = torch.cat([w.qweight for w in experts], 0)
    scales = torch.cat([w.scales for w in experts], 1).contiguous()
    zeros = torch.cat([w.zeros for w in experts], 1).contiguous() if experts[0].zeros is not None else None
    return words, scales, zeros


def _constexprs_of(w: HopperWeights, plan: Plan) -> dict[str, Any]:
    const = _constexprs(w, plan, Walk(w.blocks, 1, 1, True))
    return {**{k: const[k] for k in ("BITS", "ROWS", "SLICES_PER_ROW", "HAS_ZEROS", "WG", "BM", "STAGES")},
            "WS": plan.ws}


class GroupedExperts:
    """The grouped launch of ``plan`` over experts stacked by :meth:`stack`, in the plan's
    in-flight walk (or its warp-specialised one) over the whole of K; a schedule's tail
    tiles in a second launch of the same plan at half its width."""

    def __init__(self, w: HopperWeights, tiles: int, n_pad: int, plan: Plan) -> None:
        #: The stacked experts as one prepared state (words ``[E·tiles, …]``, scales
        #: ``[subs, E·n_pad]``); its ``runtime`` keeps this plan's descriptors.
        self.w, self.tiles, self.n_pad, self.plan = w, tiles, n_pad, plan
        self.const = _constexprs_of(w, plan)
        self._half: GroupedExperts | None = None

    @classmethod
    def stack(cls, experts: list[HopperWeights], plan: Plan) -> GroupedExperts:
        """Experts that ``hopper_wgmma`` prepared (inputs in order, no bias: an MoE's expert
        weights), of one shape and group, stacked once."""
        w0 = experts[0]
        odd = [i for i, w in enumerate(experts) if w.group_map is not None or w.ret_idx is not None
               or w.bias is not None or (w.in_features, w.out_features, w.sub_group) !=
               (w0.in_features, w0.out_features, w0.sub_group)]
        if odd or w0.blocks % 2:
            raise InvalidArgumentError(
                f"grouped experts: every expert of one shape and group, inputs in order, no bias, an even count of "
                f"K blocks; experts {odd} differ, {w0.blocks} blocks")
        words, scales, zeros = stacked(experts)
        return cls(dataclasses.replace(w0, qweight=words, scales=scales, zeros=zeros, runtime={}), w0.tiles,
                   w0.scales.shape[1], plan)

    def with_plan(self, plan: Plan) -> GroupedExperts:
        """The same stacked experts launched with ``plan``."""
        return GroupedExperts(dataclasses.replace(self.w, runtime={}), self.tiles, self.n_pad, plan)

    @property
    def half(self) -> GroupedExperts:
        """The same launch at half the plan's width (a schedule's tail tiles)."""
        if self._half is None:
            self._half = self.with_plan(dataclasses.replace(self.plan, bm=self.plan.bm // 2))
        return self._half

    @property
    def n_tiles(self) -> int:
        """Column tiles of one expert (the programs of a row tile)."""
        return triton.cdiv(self.w.out_features, TILE_N * self.plan.wg)

    def args(self, x_sorted: torch.Tensor, tables: Tables, rows: torch.Tensor,
             y: torch.Tensor) -> tuple[tuple[int], list[Any]]:
        """``(grid, positional arguments)`` of the launch over ``tables``."""
        w = self.w
        w_desc, s_desc, z_desc = weight_descriptors(w, self.plan.wg)
        return (tables.programs.shape[0],), [
            w_desc, x_descriptor(x_sorted, w.bits, self.plan.bm), s_desc, z_desc, y, tables.slots,
            tables.programs, rows, w.out_features, y.stride(0), w.blocks, w.sub_group, self.tiles, self.n_pad]

    def __call__(self, x_sorted: torch.Tensor, sched: Schedule, *, route_order: bool = False,
                 gated: bool = False) -> torch.Tensor:
        """``y [R, N]``: each sorted route's row times its expert, at the route's own row
        (``route_order``) or at its sorted row; ``gated`` (experts prepared with their
        columns in :func:`gated_columns`' order): ``[R, N/2]``, the SwiGLU of each row."""
        n = self.w.out_features
        if gated and n % 2:
            raise InvalidArgumentError(f"gated: N={n} columns must pair linear with gate (an even count)")
        x = prepare_x(x_sorted)
        y = torch.empty(x.shape[0], n // 2 if gated else n, dtype=x.dtype, device=x.device)
        self._launch(x, sched.main, sched.order, y, route_order, gated)
        if sched.tail is not None:
            self.half._launch(x, sched.tail, sched.order, y, route_order, gated)
        return y

    def _launch(self, x: torch.Tensor, tables: Tables, order: torch.Tensor, y: torch.Tensor, scatter: bool,
                gated: bool) -> None:
        grid, args = self.args(x, tables, order, y)
        grouped_kernel[grid](*args, **self.const, SCATTER=scatter, GATED=gated, num_warps=self.plan.num_warps)
