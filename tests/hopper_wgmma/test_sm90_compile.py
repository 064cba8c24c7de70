"""The kernel compiles for Hopper (sm_90a) on any machine — Triton's bundled ptxas — with
what its correctness and speed rest on: no register spills, a ring within an H100/H200
block's shared memory, HGMMA taking the dequantized operand from registers, exactly one
wgmma wait per walk step (README.md: groups left in flight across a wait computed
wrong), and the weight read with two 16-byte shared loads per thread per block."""

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
for plan, kw in [(Plan(1, 16, 8, 2), {}), (Plan(2, 256, 3, 1, 2), {"sym": False}), (Plan(1, 64, 5, 2), {"bits": 8})]:
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
    assert len(rows) == 3
    for r in rows:
        assert r["spill_stack"] == 0, r
        assert r["shared"] <= 227 * 1024, r
        per_wait = r["plan"]["per_wait"]
        assert r["hgmma"] == 2 * (16 // r["bits"]) * per_wait, r  # two k16 steps per 32-input slice
        assert len(r["depbar"]) == 1, r
        assert r["lds128"] == 2 * per_wait, r
