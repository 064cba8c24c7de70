"""The warp-level decode kernel (``backends/hopper_wgmma/decode.py``) compiles for Hopper
(sm_90a) with what its measurements rest on: no register spills, the loaded words
reshaped into the MMA's A operand without moving data (the kernel asserts the conversion
is trivial, so a layout change fails the compile), x read from shared memory by
``ldmatrix``, no other shared-memory traffic in the walk, the walk's instruction count per
code, and the split-K sum's ticket at the end."""

from __future__ import annotations

import pytest

from tests.triton_release import needs_gluon_release

from .test_sm90_compile import _bundled_tools, compiled_rows

pytestmark = needs_gluon_release

SCRIPT = """
import json
from quantcore.backends.hopper_wgmma.decode import compile_report
for kw in [dict(), dict(groups=2), dict(bits=8), dict(zeros=True, fp16=True, sub_group=32),
           dict(depth=4, steps=32), dict(rows=16), dict(rows=16, bits=8, zeros=True, fp16=True, sub_group=32)]:
    print(json.dumps(compile_report(**kw)))
"""


@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_decode_kernel_compiles_for_sm90() -> None:
    rows = compiled_rows(SCRIPT)
    assert len(rows) == 7
    for r in rows:
        walk = r["walk"]
        pairs = 16 // r["bits"]
        assert r["spill_stack"] == 0, r
        # ``depth`` steps a trip; per slice and warp one m16n8k16 per k16 half and per
        # K-group's eight x columns (two with 16 rows).
        assert walk["HMMA"] == r["depth"] * pairs * 2 * r["groups"] * r["rows"] // 8, walk
        assert walk["LDSM"] > 0, walk
        assert not {"STS", "LDS", "STL", "LDL", "BAR"} & set(walk), walk
    four_bit = rows[0]
    assert four_bit["per_code"] <= 2.5, four_bit
    assert rows[5]["per_code"] <= four_bit["per_code"] + 0.5, rows[5]  # 16 rows: one more HMMA a slice
    # The split-K sum: a ticket (an atomic) per tile.
    assert four_bit["end"]["ATOMG"] + four_bit["end"]["RED"] >= 1, four_bit["end"]
