"""The act_quant_lora kernel (``triton_nvfp4``, ``triton_ascend_int4``) for Hopper:
registers, spill stack, shared memory, and the SASS instructions per element of the main
loop (the quantizer's cost: the kernel must stay memory-bound, and NVFP4's comparison
tree is what it spends them on). One row per shape the format targets and per format,
with the tile an H100 runs it with; this is how the default tiles
(:func:`quantcore.kernels.svdquant.triton_kernel.pick_tile`) were checked without a GPU:
each compiles for sm_90 without spilling and within an H100 block's shared memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantcore.kernels.svdquant.triton_kernel import Tile, launch_geometry, pick_tile, rank_block
from quantcore.triton.compile_report import compile_sm90, longest_inner_loop, occupancy_sm90

__all__ = ["SHAPES", "compile_one", "report"]

#: (fp4, N, R) at M = 4352: the shapes of docs/formats/svdquant.md, and R = 256 (the
#: largest accumulator).
SHAPES = [(fp4, n, r) for fp4 in (True, False) for n, r in ((3840, 32), (10240, 128), (3840, 256))]


def loop_instructions(sass: str) -> int:
    """Instructions in the longest innermost loop (the walk over a row tile's steps; the
    loop over row tiles around it is not counted)."""
    return len(longest_inner_loop(sass))


def compile_one(fp4: bool, n: int, r: int, tile: Tile, *, smooth: bool = True,
                sass_dir: Path | None = None, m_pad: int = 4352) -> dict[str, Any]:
    from quantcore.kernels.svdquant.triton_source import act_quant_lora_kernel as fn

    runtime = {"x_ptr": "*bf16", "stride_xm": "i32", "rs_ptr": "*fp32", "w_ptr": "*bf16", "q_ptr": "*u8",
               "s_ptr": "*fp8e4nv" if fp4 else "*fp16", "l_ptr": "*fp32", "part_ptr": "*fp32", "cnt_ptr": "*i32",
               "M": "i32", "M_PAD": "i32", "MAXC": "i32"}
    const = {"N": n, "R": r, "FP4": fp4, "HAS_SMOOTH": smooth, "INTERPRETED": False, "GPU_MATH": True, "PTX": True,
             "TREE": tile.tree, "BM": tile.bm, "BN": tile.bn, "BR": rank_block(r), "FLAT": tile.flat,
             "PREFETCH": tile.prefetch, "RED": tile.red,
             "SLOTS": launch_geometry(tile, m_pad, n, 132)[2] if tile.flat else 0,
             "NT": 32 * tile.num_warps if tile.flat else 0}
    options: dict[str, Any] = {"num_warps": tile.num_warps, "num_stages": tile.num_stages, "enable_fp_fusion": False}
    if tile.maxnreg:
        options["maxnreg"] = tile.maxnreg
    # What the launcher's arguments specialise to (q_ptr is not: the code words go out as
    # one 32-bit store per thread and row, in the layout the quantizer computes them in).
    compiled = compile_sm90(fn, runtime, const, options=options,
                            divisible=[a for a in runtime if a not in ("M", "MAXC", "q_ptr")])
    if sass_dir is not None:
        (sass_dir / f"act_quant_lora-{'nvfp4' if fp4 else 'int4'}-N{n}-R{r}.sass").write_text(compiled.sass)
    per_thread = tile.bm * tile.bn / (tile.num_warps * 32)
    return {"fp4": fp4, "N": n, "R": r, "tile": tile.__dict__, "registers": compiled.registers,
            "spill_stack": compiled.spill_stack, "shared": compiled.shared,
            "blocks_per_sm": occupancy_sm90(compiled.registers, tile.num_warps, compiled.shared),
            "instr_per_element": round(loop_instructions(compiled.sass) / per_thread, 1)}


def h100_tile(fp4: bool, n: int, r: int, m_pad: int = 4352) -> Tile:
    """The tile an H100 runs the shape with (shipped table, else :func:`pick_tile`)."""
    import torch

    from quantcore.formats.svdquant import SVDQuantAct
    from quantcore.kernels.svdquant.configs import shipped_tile
    from quantcore.probe.card_tables import H100_SXM

    return (shipped_tile(H100_SXM, SVDQuantAct(fp4=fp4), m_pad, n, r, torch.bfloat16, True)
            or pick_tile(m_pad, n, r, fp4))


def report(*, sass_dir: Path | None = None, everything: bool = False) -> list[dict[str, Any]]:
    """One row per shape and format, with the tile an H100 runs it with."""
    return [compile_one(fp4, n, r, h100_tile(fp4, n, r), sass_dir=sass_dir) for fp4, n, r in SHAPES]
