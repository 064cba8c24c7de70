"""The kernel compiles for Hopper (sm_90a) with the H100's tiles, each for the routes it
serves (the compile-time route bound as the launcher sets it), on any machine: Triton
compiles for an explicit target with its bundled ptxas.

The decode tiles' K-loop keeps the size it had before stray expert ids were handled, and
builds its wgmma descriptors in uniform registers: a branch on the expert around the
K-loop made ptxas compute them per thread and move them over (R2UR), 285 → 314
instructions a K-step at T = 1, 10 % more time on the H100 (triton_source.py,
``_expert_tile``)."""

from __future__ import annotations

import pytest

from quantcore.triton.compile_report import tools_available
from tests.compile_report_rows import compile_report_rows
from tests.triton_release import needs_tested_release

#: T → (K-loop instructions, whole kernel's), measured with Triton 3.6's bundled ptxas.
DECODE_BUDGET = {1: (285, 776), 16: (317, 912), 64: (534, 2968)}


@pytest.mark.skipif(not tools_available(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
@needs_tested_release
def test_decode_tiles_keep_their_k_loop_and_uniform_wgmma_descriptors() -> None:
    rows = compile_report_rows("trtllm_moe_triton", timeout=900)
    decode = {r["T"]: r for r in rows if "in-kernel routes" in r["tile"]}
    assert sorted(decode) == sorted(DECODE_BUDGET)
    for t, (loop, whole) in DECODE_BUDGET.items():
        r = decode[t]
        assert r["mix"]["HGMMA"] > 0 and "R2UR" not in r["mix"], r
        assert r["loop_instructions"] <= loop, r
        assert r["instructions"] <= whole, r
        assert r["spill_stack"] == 0, r
    for r in rows:
        if r["dtype"] == "bf16":
            assert r["spill_stack"] == 0 and r["wgmma_hazards"] == 0, r
