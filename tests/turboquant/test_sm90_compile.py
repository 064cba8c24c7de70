"""The fused Triton kernels compile for Hopper (sm_90) without spilling registers —
checked on any machine: Triton compiles for an explicit target with its bundled ptxas."""

from __future__ import annotations

import pytest

from quantcore.backends.turboquant_triton.configs import ROTATION_MAX_BLOCK_M
from quantcore.triton.compile_report import tools_available
from tests.compile_report_rows import compile_report_rows
from tests.triton_release import needs_tested_release


def _geometry(r: dict) -> tuple:
    """A tensor-core row's tile, pipeline and operand: what its twins share."""
    return r["block_n"], r["block_m"], r["gpc"], r["warps"], r["stages"], r["register_operand"], r["scaled_operand"]


@pytest.mark.skipif(not tools_available(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
@needs_tested_release
def test_autotune_configs_compile_for_sm90_without_spills() -> None:
    rows = compile_report_rows("turboquant_triton")
    assert {r["kernel"] for r in rows} == {"gemv", "mma", "dequant", "fold"}
    for r in rows:
        assert r["spill_stack"] == 0, r
        assert r["shared"] + 1024 <= 227 * 1024, r  # an H100 block's limit, with the 1 KB codebook table
        # Beside the 1 KB static table, dynamic sizes in (47 KB, 48 KB] cannot launch: Triton
        # raises the opt-in limit only above 48 KB ("invalid argument" on the H100).
        assert not 47 * 1024 < r["shared"] <= 48 * 1024, r
    for r in rows:
        if r["kernel"] == "gemv":
            # The decode loop's budget (notes in backends/turboquant_triton/README.md): one
            # shared-memory lookup and about 3.5 more instructions per weight. The lookup
            # through L1 with 64-bit addresses it replaced cost 6.6 in all.
            assert r["loop_lds_per_weight"] <= (0.55 if r["lookup"] != "single" else 1.05), r  # pairs: one LDS a byte
            # Unrolled by the prefetch depth the loop has no register moves (4.77 measured);
            # once through, the rotation of the three prefetched tiles adds 0.6-0.75 (the
            # shipped configs measure 5.09-5.52).
            assert r["loop_instructions_per_weight"] <= (4.8 if r["unroll"] >= 3 else 5.7), r
        if r["kernel"] in ("mma", "fold"):
            assert r["wgmma"] > 0, r  # Hopper's warpgroup MMA, not the older mma.sync
        if r["kernel"] == "fold":
            # A persistent launch of P programs an SM must find them all resident at once
            # (else the last ones run as a second, partial wave).
            assert r["blocks_per_sm"] >= r["persistent"], r
    outside = {_geometry(r): r
               for r in rows if r["kernel"] == "mma" and r["rotation"] == "outside"}
    inside = [r for r in rows if r["kernel"] == "mma" and r["rotation"] == "kernel"]
    once = [r for r in rows if r["kernel"] == "mma" and r["rotation"] == "once"]
    # a tile wider than ROTATION_MAX_BLOCK_M rows of x never rotates it in its launch
    rotating = [g for g, r in outside.items() if r["block_m"] <= ROTATION_MAX_BLOCK_M]
    assert inside and len(inside) == len(rotating) == len(once)
    for r in once:
        twin = outside[_geometry(r)]
        # The output tiles' group loop is the outside variant's: the same matrix-unit work and
        # loads in the loop, and (the rotation programs' Π sharing the tiles' shared memory,
        # the program ids read where the tile starts) the same programs an SM.
        assert r["wgmma_in_loop"] == twin["wgmma_in_loop"] and r["rotation_loads_in_loop"] == 0, (r, twin)
        if not r["register_operand"]:
            assert r["blocks_per_sm"] == twin["blocks_per_sm"], (r, twin)
            assert r["registers"] <= twin["registers"] + 8, (r, twin)
        else:  # 16-17 registers more than outside at 64x16 (6 programs an SM become 5)
            assert r["blocks_per_sm"] >= twin["blocks_per_sm"] - 1, (r, twin)
        assert r["wgmma"] > twin["wgmma"] and r["mma_sync"] == 0, (r, twin)  # the rotation's dot: wgmma too
    for r in inside:
        twin = outside[_geometry(r)]
        # Π (one shared rotation) is loaded before the group loop and stays in shared
        # memory: the loop issues no global load the outside variant does not.
        assert r["rotation_loads_in_loop"] == 0, r
        assert r["prologue_global_loads"] > twin["prologue_global_loads"], r
        # The rotation's dot runs on wgmma too (at 4 warps, d/block_n = 2 times the weight's
        # instructions: 24 against 8).
        assert r["wgmma_in_loop"] > twin["wgmma_in_loop"] and r["mma_sync"] == 0, (r, twin)
        if r["warps"] == 4:
            assert r["wgmma_in_loop"] == twin["wgmma_in_loop"] * (1 + 128 // r["block_n"]), (r, twin)
    for r in rows:
        if r["kernel"] != "mma" or not r["register_operand"] or r["scaled_operand"]:
            continue
        twin = next(t for t in rows if t["kernel"] == "mma" and not t["register_operand"]
                    and all(t[k] == r[k] for k in ("block_n", "block_m", "gpc", "warps", "stages", "passes", "rotation")))
        new, old = r["loop_per_weight"], twin["loop_per_weight"]
        # The operand made in its register layout (backends/turboquant_triton/operand.py): no
        # store of the weight tile to shared memory, ldmatrix only for the codes (a half byte
        # a weight: one LDSM.x4 per 64 weights at 4 warps, against four for the tile), and
        # still one codebook lookup a weight.
        assert new["STS"] == 0 < old["STS"], (r, twin)
        assert new["LDSM"] * 4 <= old["LDSM"] and new["LDS"] <= 1.12, (r, twin)
        assert r["shared"] <= twin["shared"] and r["blocks_per_sm"] >= twin["blocks_per_sm"], (r, twin)
        if r["rotation"] != "kernel":  # (the in-kernel rotation's own work varies with the schedule)
            assert new["BAR"] < old["BAR"] and new["total"] <= old["total"], (r, twin)
    for r in rows:
        if r["kernel"] != "mma" or not r["scaled_operand"]:
            continue
        twin = next(t for t in rows if t["kernel"] == "mma" and t["register_operand"] and not t["scaled_operand"]
                    and all(t[k] == r[k] for k in ("block_n", "block_m", "gpc", "warps", "stages", "passes", "rotation")))
        new, old = r["loop_per_weight"], twin["loop_per_weight"]
        # The scale in the operand (MmaConfig.scaled_operand): one float32 multiply a weight,
        # no store of the tile, and beside the lookup one shared-memory read of the
        # pipelined scales a 32 weights (1/32 = 0.031).
        assert new["FMUL"] - old["FMUL"] >= 0.99 and new["STS"] == 0, (r, twin)
        assert new["LDS"] <= old["LDS"] + 0.032, (r, twin)
        # Unscaled, the group loop waits for all its MMAs once a group and pass.
        assert twin["loop_wgmma_waits"].get("0") == r["passes"] if r["rotation"] != "kernel" else True, twin
        if r["rotation"] != "kernel" and r["passes"] == 1:
            # The dot accumulating into the tile: no wait for all MMAs in the loop (each
            # k-step's wait leaves the others in flight while the next group is looked up).
            assert "0" not in r["loop_wgmma_waits"] and r["loop_wgmma_waits"], (r, twin)
