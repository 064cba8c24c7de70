"""Which rows and columns each program of the grouped MoE launch (``moe_grouped_kernel.py``)
takes: the routes sorted by expert, cut into row tiles inside one expert, in torch ops on
the ids' device with no value read back (so a call records into a CUDA graph)."""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["Schedule", "Tables", "schedule", "slot_bound"]


class Tables(NamedTuple):
    """One launch's work. ``slots`` ``[S, 3]`` int32: each row tile's ``(expert, first
    sorted route, end of the tile's routes)``, the empty slots after the last tile ``(0, 0,
    0)`` (the last slot always empty); ``programs`` ``[n_tiles · S, 2]`` int32: each
    program's ``(slot, column tile)``, expert by expert, then column tile, then row tile —
    the order of one launch per expert, so that the programs at work together share an
    expert's weight tile and its rows — the programs past the last on the empty slot."""

    slots: torch.Tensor
    programs: torch.Tensor


class Schedule(NamedTuple):
    """``order`` sorts the routes by expert (stably: a route keeps its rank among its
    expert's); ``main`` are the row tiles of the launch's width; ``tail`` (or None) each
    expert's last tile of at most half that width, for a launch at half width."""

    order: torch.Tensor
    main: Tables
    tail: Tables | None


def slot_bound(routes: int, experts: int, bm: int) -> int:
    """The most row tiles ``routes`` routes over ``experts`` experts can need (each
    expert's last tile may be partial), and one empty slot after them."""
    return routes // bm + experts + 1


def schedule(expert_ids: torch.Tensor, experts: int, bm: int, n_tiles: int, *, split_tail: bool = False) -> Schedule:
    """The schedule of routes with expert ids ``[R]`` (each in ``[0, experts)``) over row
    tiles of ``bm`` routes and ``n_tiles`` column tiles. ``split_tail``: an expert's last
    tile of at most ``bm / 2`` routes goes to ``tail``."""
    ids = expert_ids.reshape(-1).long()
    order = torch.argsort(ids, stable=True)
    # (bincount would read the largest id back to size its output: a wait, and no graph)
    counts = torch.zeros(experts, dtype=torch.long, device=ids.device).scatter_add_(0, ids, torch.ones_like(ids))
    starts = torch.cumsum(counts, 0) - counts
    ends = starts + counts
    bound = slot_bound(ids.numel(), experts, bm)
    if not split_tail:
        return Schedule(order, _tables(starts, ends, (counts + bm - 1) // bm, bm, bound, n_tiles), None)
    rest = counts % bm
    half = (rest > 0) & (rest <= bm // 2)
    full = counts // bm + ((rest > 0) & ~half).long()
    main = _tables(starts, torch.minimum(ends, starts + full * bm), full, bm, bound, n_tiles)
    tail = _tables(starts + full * bm, ends, half.long(), bm // 2, experts + 1, n_tiles)
    return Schedule(order, main, tail)


def _tables(first: torch.Tensor, end: torch.Tensor, tiles: torch.Tensor, bm: int, bound: int,
            n_tiles: int) -> Tables:
    """Per expert e: ``tiles[e]`` row tiles of ``bm`` routes from sorted route ``first[e]``,
    the last ending at ``end[e]``; ``bound`` slots, the last of them empty."""
    experts = tiles.numel()
    tile_end = torch.cumsum(tiles, 0)
    slot = torch.arange(bound, device=tiles.device)
    expert = torch.searchsorted(tile_end, slot, right=True)
    used = expert < experts
    e = expert.clamp(max=experts - 1)
    rows = torch.stack([e, first[e] + (slot - (tile_end[e] - tiles[e])) * bm, end[e]], 1) * used.unsqueeze(1)
    prog = torch.arange(n_tiles * bound, device=tiles.device)
    prog_end = torch.cumsum(tiles * n_tiles, 0)
    pe = torch.searchsorted(prog_end, prog, right=True)
    busy = pe < experts
    pe = pe.clamp(max=experts - 1)
    local = prog - (prog_end[pe] - tiles[pe] * n_tiles)
    width = tiles[pe].clamp(min=1)
    p_slot = torch.where(busy, tile_end[pe] - tiles[pe] + local % width, bound - 1)
    programs = torch.stack([p_slot, (local // width) * busy], 1)
    return Tables(rows.to(torch.int32).contiguous(), programs.to(torch.int32).contiguous())
