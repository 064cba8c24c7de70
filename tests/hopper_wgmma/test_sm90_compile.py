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


@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_plans_compile_for_sm90() -> None:
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
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
