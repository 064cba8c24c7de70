"""A grouped launch of ``hopper_wgmma``'s kernel over the experts of an MoE (a probe, not
shipped): one launch multiplies every expert's routed rows by that expert's weight.

The routes are sorted by expert (:func:`expert_slots`, on the device: nothing waits for
the GPU, so a call records into a CUDA graph); each row tile of ``BM`` routes lies inside
one expert. Program ``pid`` reads its slot — ``(expert, first route, end of the expert's
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
    warpgroup_mma_wait,
)

from quantcore.backends.hopper_wgmma.kernels import (
    _block,
    _issue,
    _mma_layout,
    _slots,
    _tile_layout,
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
from quantcore.triton.gluon_split_k import tile_store

__all__ = ["GroupedExperts", "expert_slots", "grouped_kernel", "slot_bound", "stacked"]


def slot_bound(routes: int, experts: int, bm: int) -> int:
    """The most row tiles ``routes`` routes over ``experts`` experts can need (each
    expert's last tile may be partial), and one empty slot after them."""
    return routes // bm + experts + 1


def expert_slots(expert_ids: torch.Tensor, experts: int, bm: int,
                 n_tiles: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(order, slots, programs)`` for the routes' expert ids ``[R]`` (each in ``[0,
    experts)``) and ``n_tiles`` column tiles. ``order`` sorts the routes by expert (stably:
    a route keeps its rank among its expert's); ``slots`` ``[slot_bound, 3]`` int32 holds
    each row tile's ``(expert, first sorted route, end of its expert's routes)``, the
    empty slots after the last tile ``(0, 0, 0)``; ``programs`` ``[n_tiles · slot_bound,
    2]`` int32 the ``(slot, column tile)`` of each program, expert by expert, then column
    tile by column tile, then row tile by row tile (the order of one launch per expert: the
    programs at work together share an expert's weight tile and its rows), the programs
    past the last on an empty slot. Torch ops on the ids' device, no value read back."""
    ids = expert_ids.reshape(-1).long()
    order = torch.argsort(ids, stable=True)
    # (bincount would read the largest id back to size its output: a wait, and no graph)
    counts = torch.zeros(experts, dtype=torch.long, device=ids.device).scatter_add_(0, ids, torch.ones_like(ids))
    starts = torch.cumsum(counts, 0) - counts
    tiles = (counts + bm - 1) // bm
    tile_end = torch.cumsum(tiles, 0)
    bound = slot_bound(ids.numel(), experts, bm)
    slot = torch.arange(bound, device=ids.device)
    expert = torch.searchsorted(tile_end, slot, right=True)
    used = expert < experts
    e = expert.clamp(max=experts - 1)
    first = starts[e] + (slot - (tile_end[e] - tiles[e])) * bm
    end = starts[e] + counts[e]
    slots = torch.stack([e, first, end], 1) * used.unsqueeze(1)
    prog = torch.arange(n_tiles * bound, device=ids.device)
    prog_end = torch.cumsum(tiles * n_tiles, 0)
    pe = torch.searchsorted(prog_end, prog, right=True)
    busy = pe < experts
    pe = pe.clamp(max=experts - 1)
    local = prog - (prog_end[pe] - tiles[pe] * n_tiles)
    width = tiles[pe].clamp(min=1)
    p_slot = torch.where(busy, tile_end[pe] - tiles[pe] + local % width, bound - 1)
    programs = torch.stack([p_slot, (local // width) * busy], 1)
    return order, slots.to(torch.int32).contiguous(), programs.to(torch.int32).contiguous()


@gluon.jit
def grouped_kernel(
    w_desc, x_desc, s_desc, z_desc, y_ptr, slots_ptr, programs_ptr,
    N, stride_ym, blocks, sub_group, tiles_per_expert, n_pad,
    BITS: gl.constexpr, ROWS: gl.constexpr, SLICES_PER_ROW: gl.constexpr, HAS_ZEROS: gl.constexpr,
    WG: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, WS: gl.constexpr = False,
):
    """``y[r] = x[r]·Ŵ_eᵀ`` for every sorted route r of every slot's expert e. ``w_desc``:
    the experts' words stacked ``[E·tiles, blocks·8, 256]``; ``s_desc``/``z_desc``: their
    scale and zero-point rows side by side ``[subs, E·Np]``; ``x_desc``: the sorted
    activations as ``[K/32, R, 32]``; ``slots_ptr``, ``programs_ptr``: :func:`expert_slots`'
    tables."""
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

    w_smem = gl.allocate_shared_memory(gl.int16, [STAGES] + w_desc.block_type.shape, w_desc.layout)  # noqa: RUF005 - Gluon parses list concatenation, not unpacking
    x_smem = gl.allocate_shared_memory(act, [STAGES * PAIRS, BM, 32], _tile_layout(x_desc.layout))
    S_PAD: gl.constexpr = _slots(s_desc.block_type.nbytes)
    Z_PAD: gl.constexpr = _slots(z_desc.block_type.nbytes)
    s_smem = gl.allocate_shared_memory(s_desc.dtype, [STAGES * ROWS * S_PAD] + s_desc.block_type.shape, s_desc.layout)  # noqa: RUF005 - Gluon parses list concatenation, not unpacking
    if HAS_ZEROS:
        z_smem = gl.allocate_shared_memory(z_desc.dtype, [STAGES * ROWS * Z_PAD] + z_desc.block_type.shape,  # noqa: RUF005 - Gluon parses list concatenation, not unpacking
                                           z_desc.layout)
    else:
        z_smem = s_smem
    bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for st in gl.static_range(STAGES):
        mbarrier.init(bar.index(st), count=1)
    if WS:
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for st in gl.static_range(STAGES):
            mbarrier.init(empty.index(st), count=1)
    else:
        empty = bar
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
        for p in gl.static_range(STAGES):
            if p < n_iter:
                _issue(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, p, p,
                       tile_n, m0, s_col, sub_group, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD)
        # The plain kernel's in-flight walk: two blocks a trip, the previous block's groups
        # retired after each, its stage then handed back to TMA (kernels.py says why).
        for j in range(0, n_iter, 2):
            for u in gl.static_range(2):
                acc = _block(acc, j + u, w_smem, x_smem, s_smem, z_smem, bar, STAGES, PAIRS, ROWS, SLICES_PER_ROW,
                             BITS, HAS_ZEROS, S_PAD, Z_PAD, WG, BN, act, mma_layout, a_layout, words_layout)
                acc = warpgroup_mma_wait(num_outstanding=PAIRS, deps=(acc,))
                gl.thread_barrier()
                done = j + u - 1
                if done >= 0 and done + STAGES < n_iter:
                    _issue(w_desc, x_desc, s_desc, z_desc, w_smem, x_smem, s_smem, z_smem, bar, done % STAGES,
                           done + STAGES, tile_n, m0, s_col, sub_group, BK, PAIRS, ROWS, HAS_ZEROS, S_PAD, Z_PAD)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for st in gl.static_range(STAGES):
        mbarrier.invalidate(bar.index(st))
        if WS:
            mbarrier.invalidate(empty.index(st))
    # Rows up to the expert's end only; no split, no bias (the scales stand in for the
    # workspace, counter and bias pointers that a whole tile never reads).
    tile_store(acc, pid, 0, n0, m0, y_ptr, y_ptr, y_ptr, slots_ptr, m_end, N, stride_ym, 1, False, False, BN, BM,
               NUM_WARPS)


def stacked(experts: list[Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The experts' prepared words stacked along the tiles, and their scale (and zero-point)
    rows side by side: ``(words [E·tiles, …], scales [subs, E·Np], zeros or None)``."""
    words = torch.cat([w.qweight for w in experts], 0)
    scales = torch.cat([w.scales for w in experts], 1).contiguous()
    zeros = torch.cat([w.zeros for w in experts], 1).contiguous() if experts[0].zeros is not None else None
    return words, scales, zeros


class GroupedExperts:
    """The grouped launch of ``plan`` over experts that ``hopper_wgmma`` prepared (inputs in
    order, no bias: an MoE's expert weights), in the plan's in-flight walk (or its
    warp-specialised one) over the whole of K."""

    def __init__(self, experts: list[HopperWeights], plan: Plan) -> None:
        w0 = experts[0]
        odd = [i for i, w in enumerate(experts) if w.group_map is not None or w.ret_idx is not None
               or w.bias is not None or (w.in_features, w.out_features, w.sub_group) !=
               (w0.in_features, w0.out_features, w0.sub_group)]
        if odd or w0.blocks % 2:
            raise InvalidArgumentError(
                f"grouped experts: every expert of one shape and group, inputs in order, no bias, an even count of "
                f"K blocks; experts {odd} differ, {w0.blocks} blocks")
        words, scales, zeros = stacked(experts)
        self.w = dataclasses.replace(w0, qweight=words, scales=scales, zeros=zeros, runtime={})
        self.plan, self.bits, self.n = plan, w0.bits, w0.out_features
        self.tail = (w0.out_features, w0.blocks, w0.sub_group)
        self.tiles, self.n_pad = w0.tiles, w0.scales.shape[1]
        const = _constexprs(w0, plan, Walk(w0.blocks, 1, 1, True))
        self.const = {k: const[k] for k in ("BITS", "ROWS", "SLICES_PER_ROW", "HAS_ZEROS", "WG", "BM", "STAGES")}
        self.const["WS"] = plan.ws

    def with_plan(self, plan: Plan) -> GroupedExperts:
        """The same stacked experts launched with ``plan``."""
        twin = dataclasses.replace(self.w, runtime={})
        out = object.__new__(GroupedExperts)
        out.__dict__.update(self.__dict__)
        out.w, out.plan = twin, plan
        const = _constexprs(twin, plan, Walk(twin.blocks, 1, 1, True))
        out.const = {k: const[k] for k in ("BITS", "ROWS", "SLICES_PER_ROW", "HAS_ZEROS", "WG", "BM", "STAGES")}
        out.const["WS"] = plan.ws
        return out

    @property
    def n_tiles(self) -> int:
        """Column tiles of one expert (the programs of a row tile)."""
        return triton.cdiv(self.n, TILE_N * self.plan.wg)

    def args(self, x_sorted: torch.Tensor, slots: torch.Tensor, programs: torch.Tensor,
             y: torch.Tensor) -> tuple[tuple[int], list[Any]]:
        """``(grid, positional arguments)`` of the launch over :func:`expert_slots`' tables."""
        n, blocks, sub_group = self.tail
        w_desc, s_desc, z_desc = weight_descriptors(self.w, self.plan.wg)
        return (programs.shape[0],), [w_desc, x_descriptor(x_sorted, self.bits, self.plan.bm), s_desc, z_desc, y,
                                      slots, programs, n, y.stride(0), blocks, sub_group, self.tiles, self.n_pad]

    def __call__(self, x_sorted: torch.Tensor, slots: torch.Tensor, programs: torch.Tensor) -> torch.Tensor:
        """``y_sorted [R, N]``: each sorted route's row times its slot's expert."""
        x = prepare_x(x_sorted)
        y = torch.empty(x.shape[0], self.n, dtype=x.dtype, device=x.device)
        grid, args = self.args(x, slots, programs, y)
        grouped_kernel[grid](*args, **self.const, num_warps=self.plan.num_warps)
        return y
