"""The gated activation's kernel compiles for Hopper (sm_90a) with the launcher's block
and warps, on any machine (Triton's bundled ptxas): no spills, each half read and the
output written as 16-byte vectors, and the IEEE division torch's kernels round with
(Triton's ``/`` on float32 would be the approximate ``div.full``)."""

from __future__ import annotations

import pytest

from quantcore.triton.compile_report import tools_available
from tests.compile_report_rows import compile_report_rows


@pytest.mark.skipif(not tools_available(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_every_dtype_and_activation_compiles_to_vector_accesses_and_ieee_division() -> None:
    rows = compile_report_rows("gated_activation")
    assert sorted((r["dtype"], r["activation"]) for r in rows) == sorted(
        (d, a) for d in ("bf16", "fp16", "fp32") for a in ("silu", "gelu", "relu"))
    for r in rows:
        vectors = 2 if r["dtype"] == "fp32" else 1  # 8 columns a thread: 16 or 32 bytes of each half
        assert r["spill_stack"] == 0, r
        assert r["loads"] == {"LDG.E.128": 2 * vectors}, r
        assert r["stores"] == {"STG.E.128": vectors}, r
        assert r["div_full"] == 0 and r["div_approx"] == 0, r
        assert r["div_rn"] == (8 if r["activation"] == "silu" else 0), r  # one per column a thread takes
