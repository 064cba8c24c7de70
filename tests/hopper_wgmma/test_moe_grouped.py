"""The grouped MoE launch over ``hopper_wgmma``'s kernel (``tools/probes/moe_grouped_kernel.py``,
a probe): its schedule, in torch on any device, and its kernel compiled for sm_90a here
(no spills, no register an in-flight HGMMA reads rewritten). The GPU run that checks its
bits against the plain launches is ``python -m tools.probes.moe_grouped_hopper``."""

from __future__ import annotations

import pytest
import torch

from tests.triton_release import needs_gluon_release

from .test_sm90_compile import _bundled_tools, compiled_rows


@pytest.mark.parametrize("experts,bm,n_tiles", [(8, 128, 3), (8, 64, 1), (3, 16, 5)])
@pytest.mark.parametrize("routes", [1, 7, 130, 1024])
def test_expert_slots_cover_every_route_once(experts: int, bm: int, n_tiles: int, routes: int) -> None:
    from tools.probes.moe_grouped_kernel import expert_slots, slot_bound

    gen = torch.Generator().manual_seed(routes + bm)
    # Skewed routing (one busy expert, idle ones) as well as even.
    ids = torch.randint(0, experts, (routes,), generator=gen)
    ids[: routes // 2] = experts - 1
    order, slots, programs = expert_slots(ids, experts, bm, n_tiles)
    assert slots.dtype == torch.int32 and slots.shape == (slot_bound(routes, experts, bm), 3)
    assert torch.equal(order, torch.sort(ids, stable=True).indices)
    sorted_ids = ids[order]
    covered = torch.zeros(routes, dtype=torch.int64)
    used = [s for s in slots.tolist() if s[1] < s[2]]
    for e, first, end in used:
        rows = slice(first, min(first + bm, end))
        assert bool((sorted_ids[rows] == e).all()), (e, first, end)
        assert end == int((sorted_ids <= e).sum()), "a slot's end is its expert's last route"
        covered[rows] += 1
    assert bool((covered == 1).all())
    assert len(used) == sum(-(-int((ids == e).sum()) // bm) for e in range(experts))
    assert all(s == [0, 0, 0] for s in slots.tolist()[len(used):]), "the empty slots come last"
    # Every (row tile, column tile) once, in the order of one launch per expert: expert,
    # then column tile, then row tile; the rest on the last slot, which is empty.
    assert programs.dtype == torch.int32 and programs.shape == (n_tiles * slots.shape[0], 2)
    work = [tuple(p) for p in programs.tolist()[: n_tiles * len(used)]]
    keyed = sorted(work, key=lambda p: (used[p[0]][0], p[1], p[0]))
    assert work == keyed and len(set(work)) == len(work)
    assert {p[0] for p in work} == set(range(len(used))) and {p[1] for p in work} <= set(range(n_tiles))
    assert all(p == [slots.shape[0] - 1, 0] for p in programs.tolist()[n_tiles * len(used):])
    assert slots[-1].tolist() == [0, 0, 0]


@needs_gluon_release
@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_grouped_kernel_compiles_for_sm90() -> None:
    script = """
import json
from tools.probes.moe_grouped_hopper import compile_grouped
from tools.probes.hopper_plan_times import parse_plan
for p in ("1,128,4,1,in_flight", "2,128,4,1,in_flight,ws"):
    print(json.dumps(compile_grouped(parse_plan(p))))
"""
    rows = compiled_rows(script)
    assert len(rows) == 2
    for r in rows:
        assert r["spill_stack"] == 0 and r["shared"] <= 227 * 1024, r
        assert r["hazards"] == 0, r
        assert r["hgmma"] == 8, r  # 8-bit: two slices of two k16 steps, two blocks a trip
