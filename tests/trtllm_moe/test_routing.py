"""The scheduling kernel: a stable counting sort of the routes by expert, each expert's
first sorted position and first tile, on the device and without host syncs, into one
buffer (``schedule_words``). Routes with ids outside ``[0, E)``: test_stray_ids.py."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1 (set by the quantcore pytest plugin)", allow_module_level=True)

from quantcore.backends.trtllm_moe.triton_source import route_schedule_kernel, schedule_words

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@pytest.mark.parametrize(("routes", "experts", "bm", "chunk"),
                         [(1, 8, 16, 16), (9, 4, 4, 16), (130, 8, 16, 32), (512, 1, 64, 128), (64, 8, 128, 16)])
def test_routes_sorted_stably_with_expert_starts_and_tiles(routes: int, experts: int, bm: int, chunk: int) -> None:
    ids = torch.randint(0, experts, (routes,), generator=torch.Generator().manual_seed(routes), dtype=torch.int32)
    n_tiles, x_div = 3, 2
    sched = torch.full((schedule_words(routes, experts, True),), -1, dtype=torch.int32, device=DEVICE)
    e_pad = max(2, 1 << (experts - 1).bit_length())
    r_max = max(16, 1 << (routes - 1).bit_length())
    route_schedule_kernel[(1,)](ids.to(DEVICE), sched, routes, experts, n_tiles, x_div,
                                R_MAX=r_max, BM=bm, E_PAD=e_pad, CHUNK=chunk, WRITE_TOKENS=True)
    starts, tiles, sorted_routes, tokens = sched.cpu().split([experts + 2, experts + 2, routes, routes])
    assert torch.equal(sorted_routes.long(), torch.argsort(ids, stable=True))
    assert torch.equal(tokens, sorted_routes // x_div)
    counts = torch.bincount(ids, minlength=experts)
    assert torch.equal(starts[:-1].long(), torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]))
    per = (counts + bm - 1) // bm * n_tiles
    assert torch.equal(tiles[:-1].long(), torch.cat([torch.zeros(1, dtype=torch.long), per.cumsum(0)]))
    # no stray route: the group after the experts is empty
    assert starts[-1] == starts[-2] == routes and tiles[-1] == tiles[-2]


def test_hand_example() -> None:
    ids = torch.tensor([3, 0, 3, 3, 1, 0, 3, 3, 3], dtype=torch.int32)
    sched = torch.full((schedule_words(9, 4, False),), -1, dtype=torch.int32, device=DEVICE)
    route_schedule_kernel[(1,)](ids.to(DEVICE), sched, 9, 4, 2, 1, R_MAX=16, BM=4, E_PAD=4, CHUNK=16,
                                WRITE_TOKENS=False)
    starts, tiles, sorted_routes = (t.tolist() for t in sched.cpu().split([6, 6, 9]))
    assert sorted_routes == [1, 5, 4, 0, 2, 3, 6, 7, 8]
    assert starts == [0, 2, 3, 3, 9, 9]  # then the stray routes' (none): from 9 to 9
    assert tiles == [0, 2, 4, 4, 8, 8]  # experts 0, 1: one M-tile; 2: none; 3: two; × 2 N-tiles
