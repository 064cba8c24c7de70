"""The split-K sum through a thread-block cluster's shared memory
(``tools/probes/cluster_sum_kernel.py``) compiles for Hopper (sm_90a) into what the probe's
measurement rests on: a cluster of the ranks asked for, its exchange buffer the kernel's
only shared memory (the PTX addresses it from the window's base), two cluster barriers,
one remote load a peer, CTA 0 alone storing, no spills; and its two baselines compile."""

from __future__ import annotations

import re

import pytest

from tests.triton_release import needs_gluon_release

from .test_sm90_compile import _bundled_tools, compiled_rows

pytestmark = needs_gluon_release

SCRIPT = """
import json
from tools.probes.cluster_sum_kernel import BM, BN, compile_report, floor_kernel, ticket_kernel
from quantcore.triton.compile_report import compile_sm90
for ranks in (2, 4):
    print(json.dumps(compile_report(ranks)))
for fn, sig in ((ticket_kernel, {"p_ptr": "*fp32", "y_ptr": "*fp32", "ws_ptr": "*fp32", "cnt_ptr": "*i32",
                                 "stride_ym": "i32", "N": "i32"}),
                (floor_kernel, {"p_ptr": "*fp32", "ws_ptr": "*fp32", "N": "i32"})):
    c = compile_sm90(fn, sig, {"RANKS": 4}, divisible=[a for a in sig if a.endswith("_ptr")],
                     options={"num_warps": 4}, gluon=True)
    print(json.dumps({"baseline": fn.__name__, "spill_stack": c.spill_stack}))
"""


@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_cluster_sum_compiles_for_sm90() -> None:
    rows = compiled_rows(SCRIPT)
    clusters = [r for r in rows if "ranks" in r]
    assert [r["ranks"] for r in clusters] == [2, 4]
    for r in clusters:
        ops = r["opcodes"]
        assert r["cluster"], r["ranks"]
        assert r["spill_stack"] == 0
        assert r["shared"] == 64 * 8 * 4  # the [64, 8] fp32 exchange buffer alone, at the window's base
        assert ops.get("STS") == 2 and ops.get("LDS") == 1  # Triton's store and read of the buffer, the exchange's store
        assert ops.get("UCGABAR_ARV") == 2 and ops.get("UCGABAR_WAIT") == 2
        assert ops.get("LD") == r["ranks"] - 1  # one remote load a peer
        assert re.search(r"@!?P\d+\s+(EXIT|STG)", r["sass"])  # a CTA other than 0 does not store
    assert [(r["baseline"], r["spill_stack"]) for r in rows if "baseline" in r] == [("ticket_kernel", 0),
                                                                                   ("floor_kernel", 0)]
