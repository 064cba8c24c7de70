"""The Gluon candidate of the NVFP4 pre-GEMM (``tools/probes/act_quant_lora_gluon.py``, not
shipped) compiles for Hopper (sm_90a) on any machine into what its GPU run will test: no
spills, within a block's shared memory, one TMA copy of x and one of ``lora_downᵀ`` a step,
and fewer SASS instructions an element than the shipped Triton kernel's 24.7 (24.2–25.7)."""

from __future__ import annotations

import pytest

from quantcore.triton.compile_report import tools_available
from tests.hopper_wgmma.test_sm90_compile import compiled_rows
from tests.triton_release import needs_gluon_release

SCRIPT = """
import json
from tools.probes.act_quant_lora_gluon import GluonTile, compile_report
for n, r, stages, split in ((3840, 32, 4, 4), (3840, 128, 4, 4), (10240, 32, 3, 8), (3840, 32, 6, 1)):
    print(json.dumps(compile_report(n, r, GluonTile(64, 64, stages, split))))
"""


@pytest.mark.skipif(not tools_available(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
@needs_gluon_release
def test_the_gluon_candidate_compiles_for_sm90() -> None:
    rows = compiled_rows(SCRIPT)
    assert len(rows) == 4
    for r in rows:
        assert r["spill_stack"] == 0, r
        assert r["shared"] <= 227 * 1024, r
        assert r["instr_per_element"] <= 23, r
        assert r["tma_copies_a_step"] == 2, r
        assert r["registers"] <= (168 if r["R"] > 64 else 128), r
