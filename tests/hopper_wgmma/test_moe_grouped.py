"""The grouped MoE launch over ``hopper_wgmma``'s kernel (``tools/probes/moe_grouped_kernel.py``,
a probe): its schedule, in torch on any device, and its kernel compiled for sm_90a here
(no spills, no register an in-flight HGMMA reads rewritten). The GPU run that checks its
bits against the plain launches is ``python -m tools.probes.moe_grouped_hopper``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.triton_release import needs_gluon_release

from .test_sm90_compile import _bundled_tools, assert_clean_kernels, compiled_rows


def _work(tables: Any, bm: int, n_tiles: int, sorted_ids: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """``(expert, first, end, column tile)`` of every program with work, after checking the
    tables' shape, order and empty entries."""
    slots, programs = tables.slots.tolist(), tables.programs.tolist()
    assert tables.programs.shape == (n_tiles * len(slots), 2) and tables.slots.dtype == torch.int32
    used = [s for s in slots if s[1] < s[2]]
    assert all(s == [0, 0, 0] for s in slots[len(used):]) and slots[-1] == [0, 0, 0], "the empty slots come last"
    for e, first, end in used:
        assert first < end, (e, first, end)
        assert bool((sorted_ids[first:min(first + bm, end)] == e).all()), (e, first, end)
    busy = [tuple(p) for p in programs[: n_tiles * len(used)]]
    # expert by expert, then column tile, then row tile: the order of one launch per expert
    assert busy == sorted(busy, key=lambda p: (used[p[0]][0], p[1], p[0])) and len(set(busy)) == len(busy)
    assert {p[0] for p in busy} == set(range(len(used))) and {p[1] for p in busy} <= set(range(n_tiles))
    assert all(p == [len(slots) - 1, 0] for p in programs[n_tiles * len(used):])
    return [(*used[s], n) for s, n in busy]


@pytest.mark.parametrize("split_tail", [False, True])
@pytest.mark.parametrize("experts,bm,n_tiles", [(8, 128, 3), (8, 64, 1), (3, 16, 5)])
@pytest.mark.parametrize("routes", [1, 7, 130, 1024])
def test_every_route_meets_every_column_tile_once(experts: int, bm: int, n_tiles: int, routes: int,
                                                  split_tail: bool) -> None:
    from tools.probes.moe_grouped_schedule import schedule, slot_bound

    gen = torch.Generator().manual_seed(routes + bm)
    ids = torch.randint(0, experts, (routes,), generator=gen)
    ids[: routes // 2] = experts - 1  # one busy expert and idle ones, as well as even routing
    sched = schedule(ids, experts, bm, n_tiles, split_tail=split_tail)
    assert torch.equal(sched.order, torch.sort(ids, stable=True).indices)
    assert sched.main.slots.shape[0] == slot_bound(routes, experts, bm)
    sorted_ids = ids[sched.order]
    covered = torch.zeros(routes, n_tiles, dtype=torch.int64)
    parts = [(sched.main, bm)] + ([(sched.tail, bm // 2)] if split_tail else [])
    assert (sched.tail is None) is not split_tail
    for tables, width in parts:
        for _, first, end, n in _work(tables, width, n_tiles, sorted_ids):
            covered[first:min(first + width, end), n] += 1
    assert bool((covered == 1).all())
    counts = torch.bincount(ids, minlength=experts).tolist()
    main_tiles = len([s for s in sched.main.slots.tolist() if s[1] < s[2]])
    if split_tail:  # an expert's last tile of at most bm / 2 routes runs in the half-width launch
        tails = [0 < c % bm <= bm // 2 for c in counts]
        assert main_tiles == sum(c // bm + (c % bm > bm // 2) for c in counts)
        assert len([s for s in sched.tail.slots.tolist() if s[1] < s[2]]) == sum(tails)
    else:
        assert main_tiles == sum(-(-c // bm) for c in counts)


@pytest.mark.parametrize("n", [64, 256, 28672])
def test_gated_columns_pair_each_output_with_its_gate(n: int) -> None:
    """The gated epilogue splits each pair of consecutive weight rows into an output's
    linear and gate values: in the gated order those are columns j and n/2 + j of the
    weight as stored (linear half first, as the reference SwiGLU reads it)."""
    from tools.probes.moe_grouped_kernel import gated_columns

    h = torch.randn(3, n, dtype=torch.float64)
    lin, gate = h[:, gated_columns(n)].reshape(3, n // 2, 2).unbind(-1)
    assert torch.equal(lin, h[:, : n // 2]) and torch.equal(gate, h[:, n // 2:])


def test_experts_of_different_shapes_are_refused() -> None:
    from quantcore.backends.hopper_wgmma.moe_layout import TRTLLMMoEToHopper
    from quantcore.backends.hopper_wgmma.plans import Plan
    from quantcore.errors import InvalidArgumentError
    from quantcore.formats.trtllm_moe import TRTLLMMoE
    from tools.probes.moe_grouped_kernel import GroupedExperts

    fmt = TRTLLMMoE(group_size=128, sym=True, scale_dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(0)

    def experts(n: int) -> list:
        return TRTLLMMoEToHopper(fmt).apply({
            "qweight": torch.randint(-128, 128, (1, 256, n), dtype=torch.int8, generator=gen),
            "scales": torch.rand(1, 2, n, generator=gen).to(torch.bfloat16) + 0.01})

    with pytest.raises(InvalidArgumentError, match=r"experts \[1\] differ"):
        GroupedExperts.stack(experts(128) + experts(192), Plan(1, 64, 4, 1, in_flight=True))


@needs_gluon_release
@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_grouped_kernel_compiles_for_sm90() -> None:
    script = """
import json
from tools.probes.moe_grouped_hopper import compile_grouped
from tools.probes.hopper_plan_times import parse_plan
for p, scatter, gated in (("1,128,4,1,in_flight", False, False), ("2,128,4,1,in_flight,ws", True, False),
                          ("2,64,4,1,in_flight,ws", True, True), ("2,256,3,1,in_flight,ws", True, True)):
    print(json.dumps(compile_grouped(parse_plan(p), scatter=scatter, gated=gated)))
"""
    # 8-bit: two slices of two k16 steps, two blocks a trip
    assert_clean_kernels(compiled_rows(script), 4, hgmma=8)
