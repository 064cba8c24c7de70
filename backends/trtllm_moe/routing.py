"""Sorting routes by expert for a grouped GEMM, on the device, without waiting for it.

Routes (token, slot) are grouped by expert and each expert's list padded to a multiple
of ``block``; the GEMM runs one program per block. The number of blocks depends on the
routing, so the grid is its upper bound ``R // block + min(E, R)`` (each expert adds at
most one partial block) and the blocks past the end get expert −1 and do nothing; no
host synchronisation, so the whole call can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["AlignedRoutes", "align_routes", "max_blocks"]


@dataclass(frozen=True)
class AlignedRoutes:
    sorted_routes: torch.Tensor  # int32 [blocks · block]: route ids, R where padding
    block_expert: torch.Tensor  # int32 [blocks]: expert of each block, −1 past the end
    block: int

    @property
    def num_blocks(self) -> int:
        return self.block_expert.numel()


def max_blocks(num_routes: int, num_experts: int, block: int) -> int:
    return num_routes // block + min(num_experts, num_routes)


def align_routes(route_experts: torch.Tensor, num_experts: int, block: int) -> AlignedRoutes:
    """``route_experts``: the expert of each route, ``[R]`` (valid ids)."""
    ids = route_experts.reshape(-1).long()
    r, dev = ids.numel(), ids.device
    blocks = max_blocks(r, num_experts, block)
    # scatter_add, not bincount: CUDA's bincount reads the max id back to the host.
    counts = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, ids, torch.ones_like(ids))
    padded = (counts + block - 1) // block * block
    ends = torch.cumsum(padded, 0)
    order = torch.argsort(ids, stable=True)
    expert_of = ids[order]
    first = torch.cumsum(counts, 0) - counts  # first sorted position of each expert
    dest = (ends - padded)[expert_of] + torch.arange(r, device=dev) - first[expert_of]
    sorted_routes = torch.full((blocks * block,), r, dtype=torch.int32, device=dev)
    sorted_routes[dest] = order.to(torch.int32)
    starts = torch.arange(blocks, device=dev) * block
    block_expert = torch.searchsorted(ends, starts, right=True)
    block_expert = torch.where(starts < ends[-1], block_expert, -1).to(torch.int32)
    return AlignedRoutes(sorted_routes, block_expert, block)
