"""Sorting routes by expert into blocks, on the device and without host syncs."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.trtllm_moe.routing import align_routes, max_blocks


@pytest.mark.parametrize(("routes", "experts", "block"), [(1, 8, 16), (9, 4, 4), (130, 8, 16), (512, 1, 64), (64, 8, 128)])
def test_blocks_hold_one_expert_each_and_every_route_once(routes: int, experts: int, block: int) -> None:
    ids = torch.randint(0, experts, (routes,), generator=torch.Generator().manual_seed(routes))
    aligned = align_routes(ids, experts, block)
    assert aligned.num_blocks == max_blocks(routes, experts, block)
    blocks = aligned.sorted_routes.view(-1, block).tolist()
    seen = []
    for b, (members, expert) in enumerate(zip(blocks, aligned.block_expert.tolist(), strict=True)):
        real = [r for r in members if r < routes]
        assert members[: len(real)] == real  # padding only at the end of a block
        if expert == -1:
            assert not real, f"block {b} past the end holds routes"
            continue
        assert real and all(int(ids[r]) == expert for r in real)
        seen += real
    assert sorted(seen) == list(range(routes))
    used = sum(-(-int((ids == e).sum()) // block) for e in range(experts))
    assert int((aligned.block_expert >= 0).sum()) == used


def test_hand_example() -> None:
    ids = torch.tensor([3, 0, 3, 3, 1, 0, 3, 3, 3])
    a = align_routes(ids, 4, 4)
    assert a.sorted_routes.view(-1, 4).tolist()[:4] == [[1, 5, 9, 9], [4, 9, 9, 9], [0, 2, 3, 6], [7, 8, 9, 9]]
    assert a.block_expert.tolist() == [0, 1, 3, 3, -1, -1]
