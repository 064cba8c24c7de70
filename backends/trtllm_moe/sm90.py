"""Compile the MoE kernel for Hopper (sm_90) on any machine, no GPU needed, and read the
compiler's report: registers, spill stack, shared memory, and the SASS of the main loop
(the K-loop: the shortest loop holding the matrix instructions) — its instruction mix
per weight element converted, whether the tensor-core instructions are wgmma (HGMMA),
how the weights are read from shared memory.

    python -m quantcore.backends.trtllm_moe.sm90 [--sass DIR]

Triton compiles for an explicit ``GPUTarget`` with its bundled ptxas; ``cuobjdump``
(bundled too) reads the cubin. Needs ``TRITON_INTERPRET`` unset. The arguments are
specialised as Triton's launcher specialises them (16-divisible pointers and integers).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .tiles import MoETile, pick_tile

__all__ = ["compile_one", "compile_report", "loop_mix"]

#: (name, routes, tile) at the seed's E = 8, K = 4096, N = 28672, group 128, bf16.
SEED = {"E": 8, "K": 4096, "N": 28672, "group": 128}


def _tool(name: str) -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def loop_mix(sass: str) -> tuple[int, collections.Counter[str]]:
    """Instructions of the shortest backward-branch loop that holds matrix instructions,
    counted by opcode (without modifiers)."""
    ins = re.findall(r"/\*([0-9a-f]{4,5})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)\s?([^;]*);", sass)
    spans = []
    for addr, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest)
        if op.startswith("BRA") and target and int(target.group(1), 16) < int(addr, 16):
            spans.append((int(target.group(1), 16), int(addr, 16)))
    best: tuple[int, collections.Counter[str]] = (0, collections.Counter())
    for lo, hi in sorted(spans, key=lambda s: s[1] - s[0]):
        body = [op.split(".")[0] for a, op, _ in ins if lo <= int(a, 16) <= hi]
        if any(op in ("HGMMA", "HMMA") for op in body):
            return len(body), collections.Counter(body)
    return best


def compile_one(
    tile: MoETile, *, gated: bool = False, sym: bool = True, dtype: str = "bf16", sass_dir: Path | None = None,
    **shape: int,
) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .triton_source import moe_w8a16_kernel as fn

    dims = {**SEED, **shape}
    k, n, e, group = dims["K"], dims["N"], dims["E"], dims["group"]
    ptrs = {"x_ptr": f"*{dtype}", "w_ptr": "*i32", "s_ptr": f"*{dtype}", "z_ptr": f"*{dtype}", "ids_ptr": "*i32",
            "sorted_ptr": "*i32", "starts_ptr": "*i32", "tiles_ptr": "*i32", "rw_ptr": "*fp32", "y_ptr": f"*{dtype}"}
    ints = {"stride_x": k, "x_div": 2, "stride_y": n // 2 if gated else n, "R": 3, "E": e, "N": n,
            "COLS": n // 2 if gated else n, "HALF": n // 2, "G": k // group, "TILES": 3, "PROGS": 3}
    const = {"K": k, "GROUP": group, "BM": tile.bm, "BN": tile.bn, "BK": tile.bk, "R_PAD": 32,
             "E_PAD": max(2, 1 << (e - 1).bit_length()), "SCHEDULED": tile.scheduled,
             "PERSISTENT": tile.scheduled and tile.persistent > 0, "X_SORTED": tile.x_sorted, "GATED": gated,
             "HAS_RW": False, "SYM": sym, "PRE_SCALE": tile.pre_scale, "EXACT_FMA": dtype == "bf16",
             "ASM": tile.asm, "FP32_DOT": False, "SCALE_PAIRS": tile.scale_pairs,
             "SPLIT_TAIL": tile.split_tail}
    names = list(fn.arg_names)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in ptrs}
    attrs |= {(names.index(a),): [["tt.divisibility", 16]] for a, v in ints.items() if v % 16 == 0}
    signature = {**ptrs, **{a: "i32" for a in ints}, **{c: "constexpr" for c in const}}
    src = ASTSource(fn=fn, signature=signature, constexprs=const, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": tile.num_warps, "num_stages": tile.num_stages})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([str(_tool("cuobjdump")), "-res-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([str(_tool("cuobjdump")), "-sass", str(cubin)],
                              capture_output=True, text=True, check=True).stdout
    if sass_dir is not None:
        sass_dir.mkdir(parents=True, exist_ok=True)
        stem = f"moe-{tile.bm}x{tile.bn}x{tile.bk}-w{tile.num_warps}s{tile.num_stages}" + (
            "-sched" if tile.scheduled else "-small") + ("-gated" if gated else "")
        (sass_dir / f"{stem}.sass").write_text(sass)
        (sass_dir / f"{stem}.ttgir").write_text(kernel.asm["ttgir"])

    def get(key: str) -> int:
        hit = re.search(rf"{key}:(\d+)", usage)
        return int(hit.group(1)) if hit else -1

    count, mix = loop_mix(sass)
    # weight elements this thread converts per K-step: BN·BK over the threads
    per_thread = tile.bn * tile.bk / (tile.num_warps * 32)
    keep = ("HGMMA", "HMMA", "LDSM", "LDS", "LDGSTS", "LDG", "PRMT", "LOP3", "SHF", "FFMA", "FADD", "FMUL", "F2FP",
            "BAR", "WARPGROUP", "LDL", "STL")
    return {"tile": tile.describe(), "gated": gated, "sym": sym, "dtype": dtype, "registers": get("REG"),
            "spill_stack": get("STACK"), "shared": kernel.metadata.shared, "loop_instructions": count,
            "per_weight_element": round(count / per_thread, 2), "mix": {op: mix[op] for op in keep if mix[op]}}


def compile_report(sass_dir: Path | None = None) -> list[dict[str, Any]]:
    """The shipped tiles at the seed's shape for T ∈ {1, 16, 64, 512, 4096} (top-2), and the
    fused-SwiGLU and asymmetric variants of the prefill tile."""
    rows = []
    for t in (1, 16, 64, 512, 4096):
        tile = pick_tile(2 * t, SEED["E"], SEED["K"], SEED["group"])
        rows.append({"T": t, **compile_one(tile, sass_dir=sass_dir)})
    prefill = pick_tile(2 * 4096, SEED["E"], SEED["K"], SEED["group"])
    rows.append({"T": 4096, **compile_one(prefill, gated=True, sass_dir=sass_dir)})
    rows.append({"T": 4096, **compile_one(prefill, sym=False)})
    rows.append({"T": 4096, **compile_one(prefill, dtype="fp16")})
    return rows


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU target")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sass", type=Path, default=None, help="write each kernel's SASS and TTGIR here")
    args = ap.parse_args()
    json.dump(compile_report(args.sass), sys.stdout, default=str, indent=1)
