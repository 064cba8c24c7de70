"""Warp-specialised plans (``Plan.ws``) compile for sm_90a on any machine (Triton's bundled
ptxas) with what they rest on: no spills, the ring within a block's shared memory, no
register an in-flight HGMMA reads written before its wait, the in-flight walk's HGMMAs and
waits per loop trip, no TMA issue and no CTA-wide barrier in the consumers' loop (the
producer warp's own loop issues the loads), fewer loop instructions than the same tile
without the producer, and the producer warp's registers handed to the consumers
(``setmaxnreg``: SASS ``USETMAXREG``, 24 for the producer).

What the loop still holds: Gluon's ``mbarrier.arrive`` is one thread's, so the compiler
puts a barrier over the consumer warps (named, ``BAR.SYNC 0, 128·WG``; the producer is not
in it) before each arrive and before the next stage's wait — two per block."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.triton_release import needs_gluon_release

from .test_sm90_compile import _bundled_tools

pytestmark = needs_gluon_release

SCRIPT = """
import json, torch
from tools.probes.hopper_wgmma_sass import compile_plan
from quantcore.backends.hopper_wgmma.plans import Plan
for wg, bm, stages, kw in [(2, 256, 3, {}), (2, 128, 4, {"sym": False}),
                           (1, 128, 4, {"group": 32, "dtype": torch.float16})]:
    for ws in (True, False):
        r = compile_plan(Plan(wg, bm, stages, 1, in_flight=True, ws=ws), **kw)
        r.pop("sass")
        print(json.dumps(r))
"""


@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_warp_specialised_plans_compile_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 6
    for r, twin in zip(rows[::2], rows[1::2], strict=True):
        assert r["plan"]["ws"] and not twin["plan"]["ws"]
        wg, groups = r["plan"]["wg"], 16 // r["bits"]
        assert r["spill_stack"] == 0, r
        assert r["shared"] <= 227 * 1024, r
        assert r["hazards"] == 0, r["first_hazards"]
        # The consumers' loop: the in-flight walk's two blocks per trip.
        assert r["hgmma"] == twin["hgmma"] == 2 * groups * 2, r
        assert r["lds128"] == 4, r
        assert r["depbar"] == [f"WARPGROUP.DEPBAR.LE gsb0, {groups:#x}"] * 2, r
        # No TMA issue and no CTA-wide barrier there; the barriers left span the consumer warps only.
        assert r["tma"] == 0 and twin["tma"] > 0, (r, twin)
        assert r["bar_cta"] == 0 and twin["bar_cta"] > 0, (r, twin)
        assert len(r["bar_named"]) <= 4 and set(r["bar_named"]) <= {128 * wg}, r
        assert r["loop_instructions"] < twin["loop_instructions"], (r, twin)
        # The producer's loop, and its registers given up (24) to the consumers.
        assert r["producer_loop_instructions"] > 0, r
        assert "0x18" in r["setmaxnreg"] and not twin["setmaxnreg"], (r, twin)
        assert r["warps"] > twin["warps"] == 4 * wg, (r, twin)
