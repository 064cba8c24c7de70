"""Compile the act_quant_lora kernel for Hopper (sm_90) on any machine, no GPU needed,
and read the compiler's report: registers, spill stack, shared memory, and the SASS
instructions per element of the main loop (the quantizer's cost: the kernel must stay
memory-bound, and NVFP4's comparison tree is what it spends them on).

    python -m quantcore.backends.svdquant.sm90

Triton compiles for an explicit ``GPUTarget`` with its bundled ptxas; ``cuobjdump``
(bundled too) reads the cubin. Needs ``TRITON_INTERPRET`` unset. This is how the default
tiles (:func:`.triton_kernel.pick_tile`) were checked without a GPU: each compiles for
sm_90 without spilling and within an H100 block's shared memory.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .triton_kernel import Tile, pick_tile, rank_block

__all__ = ["SHAPES", "compile_report"]

#: (fp4, N, R) at M = 4352: the seed's shapes, and R = 256 (the largest accumulator).
SHAPES = [(fp4, n, r) for fp4 in (True, False) for n, r in ((3840, 32), (10240, 128), (3840, 256))]


def _tool(name: str) -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def _loop_instructions(sass: str) -> int:
    """Instructions in the longest innermost backward-branch loop (the walk over a row
    tile's steps; the loop over row tiles around it is not counted)."""
    ins = re.findall(r"/\*([0-9a-f]{4,5})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)\s([^;]*);", sass)
    loops = []
    for addr, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest)
        if op.startswith("BRA") and target and int(target.group(1), 16) < int(addr, 16):
            loops.append((int(target.group(1), 16), int(addr, 16)))
    inner = [a for a in loops if not any(b != a and a[0] <= b[0] and b[1] <= a[1] for b in loops)]
    if not inner:
        return 0
    lo, hi = max(inner, key=lambda span: span[1] - span[0])
    return sum(1 for addr, _, _ in ins if lo <= int(addr, 16) <= hi)


def compile_one(fp4: bool, n: int, r: int, tile: Tile, *, smooth: bool = True) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .triton_source import act_quant_lora_kernel as fn

    runtime = {"x_ptr": "*bf16", "stride_xm": "i32", "rs_ptr": "*fp32", "w_ptr": "*bf16", "q_ptr": "*i32",
               "s_ptr": "*u8" if fp4 else "*i16", "l_ptr": "*fp32", "part_ptr": "*fp32", "cnt_ptr": "*i32",
               "M": "i32", "M_PAD": "i32", "MAXC": "i32"}
    const = {"N": n, "R": r, "FP4": fp4, "HAS_SMOOTH": smooth, "INTERPRETED": False, "GPU_MATH": True, "PTX": True,
             "TREE": tile.tree, "BM": tile.bm, "BN": tile.bn, "BR": rank_block(r)}
    names = list(fn.arg_names)
    # what the launcher's arguments specialise to (q_ptr is not: the code words go out as
    # one 32-bit store per thread and row, in the layout the quantizer computes them in)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in runtime if a not in ("M", "MAXC", "q_ptr")}
    src = ASTSource(fn=fn, signature={**runtime, **{k: "constexpr" for k in const}}, constexprs=const, attrs=attrs)
    options: dict[str, Any] = {"num_warps": tile.num_warps, "num_stages": tile.num_stages, "enable_fp_fusion": False}
    if tile.maxnreg:
        options["maxnreg"] = tile.maxnreg
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([str(_tool("cuobjdump")), "-res-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([str(_tool("cuobjdump")), "-sass", str(cubin)],
                              capture_output=True, text=True, check=True).stdout

    def get(key: str) -> int:
        hit = re.search(rf"{key}:(\d+)", usage)
        return int(hit.group(1)) if hit else -1

    per_thread = tile.bm * tile.bn / (tile.num_warps * 32)
    return {"fp4": fp4, "N": n, "R": r, "tile": tile.__dict__, "registers": get("REG"), "spill_stack": get("STACK"),
            "shared": kernel.metadata.shared, "instr_per_element": round(_loop_instructions(sass) / per_thread, 1)}


def h100_tile(fp4: bool, n: int, r: int, m_pad: int = 4352) -> Tile:
    """The tile an H100 runs the shape with (shipped table, else :func:`pick_tile`)."""
    import torch

    from quantcore.formats.svdquant import SVDQuantAct

    from .configs import shipped_tile

    return (shipped_tile("NVIDIA H100 80GB HBM3", SVDQuantAct(fp4=fp4), m_pad, n, r, torch.bfloat16, True)
            or pick_tile(m_pad, n, r, fp4))


def compile_report() -> list[dict[str, Any]]:
    """One row per seed shape and format, with the tile an H100 runs it with."""
    return [compile_one(fp4, n, r, h100_tile(fp4, n, r)) for fp4, n, r in SHAPES]


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU target")
    json.dump(compile_report(), sys.stdout, default=str, indent=1)
