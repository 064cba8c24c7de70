"""The ``trtllm_moe_triton`` kernel for Hopper (sm_90): registers, spill stack, shared
memory, and the SASS of the main loop (the K-loop: the shortest loop holding the matrix
instructions) — its instruction mix per weight element converted, whether the tensor-core
instructions are wgmma (HGMMA), how the weights are read from shared memory, whether the
wgmma descriptors are moved from per-thread registers (R2UR) — and the kernel's
instructions in all. The arguments are specialised as Triton's launcher specialises them
(16-divisible pointers and integers) and the route bound follows the call's routes, as
in the launcher (``tiles.route_bound``)."""

from __future__ import annotations

import collections
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from quantcore.backends.trtllm_moe.tiles import (
    SCAN_LOG,
    MoETile,
    pick_tile,
    pow2_at_least,
    route_bound,
)
from quantcore.probe.card_tables import H100_SXM
from quantcore.triton.compile_report import (
    backward_loops,
    compile_sm90,
    instructions,
    opcode_counts,
    opcodes_in,
)
from quantcore.triton.wgmma_hazards import register_operand_hazards

__all__ = ["SHAPE", "compile_one", "loop_mix", "report"]

#: The shape of docs/formats/trtllm_moe.md: E = 8, K = 4096, N = 28672, group 128, bf16.
SHAPE = {"E": 8, "K": 4096, "N": 28672, "group": 128}


def loop_mix(sass: str) -> tuple[int, collections.Counter[str]]:
    """Instructions of the shortest loop that holds matrix instructions, counted by opcode
    (without modifiers)."""
    ins = instructions(sass)
    for span in sorted(backward_loops(ins), key=lambda s: s[1] - s[0]):
        body = opcode_counts(opcodes_in(ins, span))
        if body["HGMMA"] or body["HMMA"]:
            return sum(body.values()), body
    return 0, collections.Counter()


def compile_one(
    tile: MoETile, *, routes: int = 32, gated: bool = False, sym: bool = True, dtype: str = "bf16",
    sass_dir: Path | None = None, **shape: int,
) -> dict[str, Any]:
    """``tile`` compiled for a call of ``routes`` routes (T · top-k) at :data:`SHAPE`
    (``shape`` overrides its entries)."""
    from quantcore.backends.trtllm_moe.triton_source import moe_w8a16_kernel as fn

    dims = {**SHAPE, **shape}
    k, n, e, group = dims["K"], dims["N"], dims["E"], dims["group"]
    ptrs = {"x_ptr": f"*{dtype}", "w_ptr": "*i32", "s_ptr": f"*{dtype}", "z_ptr": f"*{dtype}", "ids_ptr": "*i32",
            "sched_ptr": "*i32", "rw_ptr": "*fp32", "y_ptr": f"*{dtype}"}
    ints = {"stride_x": k, "x_div": 2, "stride_y": n // 2 if gated else n, "R": 3, "E": e, "N": n,
            "COLS": n // 2 if gated else n, "HALF": n // 2, "G": k // group, "TILES": 3, "PROGS": 3}
    const = {"K": k, "GROUP": group, "BM": tile.bm, "BN": tile.bn, "BK": tile.bk, "R_PAD": route_bound(tile, routes),
             "E_PAD": pow2_at_least(e, 2), "KEYS": pow2_at_least(e + 1, 2), "SCAN_LOG": SCAN_LOG,
             "SCHEDULED": tile.scheduled, "SCHEDULE_KERNEL": tile.two_launches,
             "PERSISTENT": tile.scheduled and tile.persistent > 0, "X_SORTED": tile.x_sorted, "GATED": gated,
             "HAS_RW": False, "SYM": sym, "PRE_SCALE": tile.pre_scale, "EXACT_FMA": dtype == "bf16",
             "ASM": tile.asm, "FP32_DOT": False, "SCALE_PAIRS": tile.scale_pairs,
             "SPLIT_TAIL": tile.split_tail}
    compiled = compile_sm90(fn, {**ptrs, **{a: "i32" for a in ints}}, const,
                            options={"num_warps": tile.num_warps, "num_stages": tile.num_stages},
                            divisible=[*ptrs, *(a for a, v in ints.items() if v % 16 == 0)])
    if sass_dir is not None:
        stem = f"moe-{tile.bm}x{tile.bn}x{tile.bk}-w{tile.num_warps}s{tile.num_stages}" + (
            ("-sched2" if tile.two_launches else "-sched") if tile.scheduled else f"-small-r{route_bound(tile, routes)}") + ("-gated" if gated else "")
        (sass_dir / f"{stem}.sass").write_text(compiled.sass)
        (sass_dir / f"{stem}.ttgir").write_text(compiled.asm["ttgir"])
    count, mix = loop_mix(compiled.sass)
    # weight elements this thread converts per K-step: BN·BK over the threads
    per_thread = tile.bn * tile.bk / (tile.num_warps * 32)
    keep = ("HGMMA", "HMMA", "LDSM", "LDS", "LDGSTS", "LDG", "PRMT", "LOP3", "SHF", "FFMA", "FADD", "FMUL", "F2FP",
            "BAR", "WARPGROUP", "R2UR", "LDL", "STL")
    return {"tile": tile.describe(), "gated": gated, "sym": sym, "dtype": dtype, "registers": compiled.registers,
            "spill_stack": compiled.spill_stack, "shared": compiled.shared,
            "instructions": len(instructions(compiled.sass)), "loop_instructions": count,
            "per_weight_element": round(count / per_thread, 2), "mix": {op: mix[op] for op in keep if mix[op]},
            "wgmma_hazards": len(register_operand_hazards(compiled.sass))}


def report(*, sass_dir: Path | None = None, everything: bool = False) -> list[dict[str, Any]]:
    """The H100's tiles at the shape for T ∈ {1, 16, 64, 512, 4096} (top-2), the prefill
    tile scheduled the other way (one launch or two), its fused-SwiGLU variants both
    ways, its asymmetric variant, and its fp16 tile."""
    rows = []
    for t in (1, 16, 64, 512, 4096):
        tile = pick_tile(2 * t, SHAPE["E"], SHAPE["K"], SHAPE["group"], card=H100_SXM)
        rows.append({"T": t, **compile_one(tile, routes=2 * t, sass_dir=sass_dir)})
    prefill = pick_tile(2 * 4096, SHAPE["E"], SHAPE["K"], SHAPE["group"], card=H100_SXM)
    # the other way of scheduling the prefill tile (one launch or two: tiles.ONE_LAUNCH_MAX_ROUTES)
    other = replace(prefill, schedule_kernel=not prefill.two_launches)
    rows.append({"T": 4096, **compile_one(other, routes=2 * 4096, sass_dir=sass_dir)})
    rows.append({"T": 4096, **compile_one(prefill, routes=2 * 4096, gated=True, sass_dir=sass_dir)})
    rows.append({"T": 4096, **compile_one(other, routes=2 * 4096, gated=True, sass_dir=sass_dir)})
    rows.append({"T": 4096, **compile_one(prefill, routes=2 * 4096, sym=False)})
    fp16 = pick_tile(2 * 4096, SHAPE["E"], SHAPE["K"], SHAPE["group"], scale_dtype=torch.float16, card=H100_SXM)
    rows.append({"T": 4096, **compile_one(fp16, routes=2 * 4096, dtype="fp16")})
    return rows
