"""The kernel compiles for Hopper (sm_90a) on any machine — Triton's bundled ptxas — with
what its correctness and speed rest on: no register spills, a ring within an H100/H200
block's shared memory, HGMMA taking the dequantized operand from registers, one wgmma
wait per block left in flight (or per walk step, all groups), no instruction writing a
register an in-flight HGMMA reads (README.md: plans that did computed wrong), and the
weight read with two 16-byte shared loads per thread per block."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.triton_release import needs_gluon_release

pytestmark = needs_gluon_release


def _bundled_tools() -> bool:
    import importlib.util

    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return False
    bin_dir = Path(spec.origin).parent / "backends" / "nvidia" / "bin"
    return (bin_dir / "ptxas").exists() and (bin_dir / "cuobjdump").exists()


SCRIPT = """
import json, torch
from tools.probes.hopper_wgmma_sass import compile_plan
from quantcore.backends.hopper_wgmma.plans import Plan
for plan, kw in [(Plan(1, 16, 8, 2), {}), (Plan(2, 256, 3, 1, 2), {"sym": False}), (Plan(1, 64, 5, 2), {"bits": 8}),
                 (Plan(2, 256, 3, 1, in_flight=True), {"sym": False}), (Plan(1, 16, 8, 2, in_flight=True), {"bits": 8}),
                 (Plan(2, 128, 4, 1, in_flight=True), {"group": 32, "dtype": torch.float16})]:
    r = compile_plan(plan, **kw)
    r.pop("sass")
    print(json.dumps(r))
"""


def compiled_rows(script: str) -> list[dict]:
    """The JSON rows ``script`` prints, run in a fresh interpreter (no Triton interpreter
    mode: it compiles for sm_90a)."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def assert_clean_kernels(rows: list[dict], count: int, hgmma: int) -> None:
    """``count`` compiled kernels, each without spills or operand hazards, within the
    H100/H200 shared memory, with ``hgmma`` HGMMAs in its walk."""
    assert len(rows) == count
    for r in rows:
        assert r["spill_stack"] == 0 and r["shared"] <= 227 * 1024, r
        assert r["hazards"] == 0, r
        assert r["hgmma"] == hgmma, r


@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_plans_compile_for_sm90() -> None:
    rows = compiled_rows(SCRIPT)
    assert len(rows) == 6
    for r in rows:
        assert r["spill_stack"] == 0, r
        assert r["shared"] <= 227 * 1024, r
        assert r["hazards"] == 0, r["first_hazards"]
        blocks = 2 if r["plan"]["in_flight"] else r["plan"]["per_wait"]  # blocks per trip of the walk
        assert r["hgmma"] == 2 * (16 // r["bits"]) * blocks, r  # two k16 steps per 32-input slice
        assert r["lds128"] == 2 * blocks, r
        groups = 16 // r["bits"]  # one per slice
        waits = [f"WARPGROUP.DEPBAR.LE gsb0, {groups:#x}"] * 2 if r["plan"]["in_flight"] else ["WARPGROUP.DEPBAR.LE gsb0, 0x0"]
        assert r["depbar"] == waits, r


PDL_SCRIPT = """
import json, os, re, sys
os.environ["QUANTCORE_HOPPER_PDL"] = sys.argv[1]
from tools.probes.hopper_wgmma_sass import compile_plan
from quantcore.backends.hopper_wgmma.plans import Plan
r = compile_plan(Plan(1, 8, 4, 2, in_flight=True))
ops = [m.group(1) for m in re.finditer(r"\\b(UTMALDG\\.[23]D|ACQBULK)\\b", r.pop("sass"))]
print(json.dumps({"registers": r["registers"], "spill": r["spill_stack"], "hazards": r["hazards"], "ops": ops}))
"""


@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_programmatic_dependent_launch_waits_before_x_and_costs_no_registers() -> None:
    """``griddepcontrol.wait`` is ACQBULK in sm_90a SASS. ``wait``: before every TMA load;
    ``prefetch``: after the weight side of the ring's first stages (3-D words, 2-D scale
    rows), before any of x's tiles (3-D) — so nothing another kernel writes is read early."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    runs = {}
    for mode in ("off", "wait", "prefetch"):
        out = subprocess.run([sys.executable, "-c", PDL_SCRIPT, mode], capture_output=True, text=True, env=env,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    assert "ACQBULK" not in runs["off"]["ops"]
    for mode in ("wait", "prefetch"):
        r = runs[mode]
        assert r["registers"] == runs["off"]["registers"] and r["spill"] == 0 and r["hazards"] == 0, r
        assert r["ops"].count("ACQBULK") == 1, r
    wait_ops = runs["wait"]["ops"]
    assert wait_ops[0] == "ACQBULK", wait_ops
    ops = runs["prefetch"]["ops"]
    before = ops[:ops.index("ACQBULK")]
    stages = 4
    assert before.count("UTMALDG.3D") == stages and before.count("UTMALDG.2D") == stages, ops  # words, scales
    assert ops[ops.index("ACQBULK") + 1:][:stages] == ["UTMALDG.3D"] * stages, ops  # then x's tiles
