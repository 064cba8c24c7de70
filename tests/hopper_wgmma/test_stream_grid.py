"""Balanced (stream-K) grids (``Plan.stream``), checked without a GPU: the plan's rules,
the launcher's grid and workspace against a model of how the kernel cuts the tiles' pairs
of K blocks (every pair walked once, a tile's programs ranked from 0, the workspace
holding the most programs one tile has), refusals by name, and an sm_90a compile (no
spill, no operand hazard, the in-flight loop's HGMMA and waits). The kernel runs on
sm_90 only (``tools/probes/hopper_plan_times.py`` checks and times it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from quantcore.backends.hopper_wgmma import launch
from quantcore.backends.hopper_wgmma.plans import Plan
from quantcore.errors import InvalidArgumentError
from tests.triton_release import needs_gluon_release

from .test_sm90_compile import _bundled_tools, compiled_rows


def _weights(k: int, n: int) -> SimpleNamespace:
    return SimpleNamespace(blocks=k // 128, in_features=k, out_features=n)


def _kernel_runs(units: int, pairs: int, grid: int) -> dict[int, list[tuple[int, int]]]:
    """What the kernel's programs do: per tile, ``(program, rank)`` of each program that
    walks some of its pairs, the rank as the kernel computes it from the tile's first pair."""
    runs: dict[int, list[tuple[int, int]]] = {}
    for pid in range(grid):
        lo, hi = pid * units // grid, (pid + 1) * units // grid
        u = lo
        while u < hi:
            tile = u // pairs
            seg_end = min(hi, (tile + 1) * pairs)
            first = ((tile * pairs + 1) * grid - 1) // units
            runs.setdefault(tile, []).append((pid, pid - first))
            u = seg_end
    return runs


@pytest.mark.parametrize(("k", "n", "m", "bm", "per_sm", "sms"), [
    (4096, 14336, 1, 8, 2, 132), (14336, 4096, 1, 8, 3, 132), (4096, 200, 37, 16, 3, 132),
    (4096, 1024, 16, 16, 4, 114), (256, 64, 1, 8, 8, 132),
])
def test_the_grid_cuts_every_pair_once_and_the_workspace_holds_every_rank(k, n, m, bm, per_sm, sms) -> None:
    w = _weights(k, n)
    plan = Plan(1, bm, 4, in_flight=True, stream=per_sm)
    grid, slots = launch.stream_grid(w, plan, m, sms)
    pairs = w.blocks // 2
    tiles = -(-n // 64) * -(-m // bm)
    units = tiles * pairs
    assert grid == min(units, sms * per_sm)
    runs = _kernel_runs(units, pairs, grid)
    assert sorted(runs) == list(range(tiles))
    walked = sorted(u for pid in range(grid) for u in range(pid * units // grid, (pid + 1) * units // grid))
    assert walked == list(range(units))  # every pair once
    for tile, progs in runs.items():
        assert [rank for _, rank in progs] == list(range(len(progs))), tile  # ranks 0, 1, … in program order
        assert len(progs) <= slots
    assert slots == max(len(p) for p in runs.values())


def test_plan_rules_and_refusals() -> None:
    with pytest.raises(ValueError, match="stream"):
        Plan(1, 8, 4, stream=2)  # not in flight
    with pytest.raises(ValueError, match="stream"):
        Plan(1, 8, 4, in_flight=True, ws=True, stream=2)
    with pytest.raises(ValueError, match="stream"):
        Plan(1, 8, 4, 2, in_flight=True, stream=2)  # with a split
    with pytest.raises(InvalidArgumentError, match=r"pairs of K blocks; this weight has 3 blocks \(K = 384\)"):
        launch.stream_grid(_weights(384, 64), Plan(1, 8, 4, in_flight=True, stream=2), 1, 132)
    weights = SimpleNamespace(qweight=torch.zeros(1))
    with pytest.raises(InvalidArgumentError, match="balanced grid is timed through linear"):
        launch.WgmmaBucket(weights, torch.bfloat16, torch.device("cpu"), Plan(1, 8, 4, in_flight=True, stream=2))


SCRIPT = """
import json
from tools.probes.hopper_wgmma_sass import compile_plan
from quantcore.backends.hopper_wgmma.plans import Plan
for plan, kw in [(Plan(1, 8, 8, 1, in_flight=True, stream=2), {"n": 14336}),
                 (Plan(1, 16, 4, 1, in_flight=True, stream=3), {"sym": False}),
                 (Plan(2, 64, 3, 1, in_flight=True, stream=2), {})]:
    r = compile_plan(plan, **kw)
    r.pop("sass")
    print(json.dumps(r))
"""


@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
@needs_gluon_release
def test_balanced_plans_compile_for_sm90() -> None:
    rows = compiled_rows(SCRIPT)
    assert len(rows) == 3
    for r in rows:
        assert r["spill_stack"] == 0, r
        assert r["shared"] <= 227 * 1024, r
        assert r["hazards"] == 0, r["first_hazards"]
        assert r["hgmma"] == 16, r  # two blocks a trip, four 32-input slices, two k16 steps each
        assert r["depbar"] == ["WARPGROUP.DEPBAR.LE gsb0, 0x4"] * 2, r
