"""The gated activation's kernel (``quantcore/kernels/gated_activation``) for Hopper: per
dtype and activation, at a tensor-parallel rank's intermediate size (Llama-3-8B's 14336 over
two ranks), with the block and warps the launcher takes: registers, spill stack, the
global loads and stores (one 16-byte vector of each half per thread in bf16/fp16, two in
fp32), and what the PTX divides and exponentiates with (the IEEE ``div.rn``, never the
approximate ``div.full``: the kernel must round as torch's CUDA kernels do)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from quantcore.kernels.gated_activation import ACTIVATIONS
from quantcore.triton.compile_report import compile_sm90, instructions, opcode_counts

__all__ = ["INTER", "compile_one", "report"]

#: A rank's intermediate size at world 2 for Llama-3-8B (14336 / 2).
INTER = 7168
DTYPES = ("bf16", "fp16", "fp32")


def compile_one(dtype: str, activation: str, inter: int = INTER, *, sass_dir: Path | None = None) -> dict[str, Any]:
    from quantcore.kernels.gated_activation.triton_launch import block_of
    from quantcore.kernels.gated_activation.triton_source import gated_activation_kernel as fn

    block, warps = block_of(inter)
    runtime = {"h_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "h_row_stride": "i32"}
    const = {"INTER": inter, "ACT": activation, "BLOCK": block, "COMPILED": True}
    # What the launcher's arguments specialise to for a fused layer's output: aligned
    # pointers, a row stride of 2·I.
    compiled = compile_sm90(fn, runtime, const, divisible=list(runtime),
                            options={"num_warps": warps, "enable_fp_fusion": False})
    if sass_dir is not None:
        (sass_dir / f"gated_activation-{activation}-{dtype}-I{inter}.sass").write_text(compiled.sass)
    ops = [i.opcode for i in instructions(compiled.sass)]
    ptx = compiled.asm["ptx"]
    return {"dtype": dtype, "activation": activation, "I": inter, "block": block, "num_warps": warps,
            "registers": compiled.registers, "spill_stack": compiled.spill_stack, "instructions": len(ops),
            "loads": {op: n for op, n in sorted(_counts(ops, "LDG").items())},
            "stores": {op: n for op, n in sorted(_counts(ops, "STG").items())},
            "mix": dict(opcode_counts(ops).most_common(8)),
            "div_rn": len(re.findall(r"\bdiv\.rn\.f32\b", ptx)), "div_full": len(re.findall(r"\bdiv\.full\.f32\b", ptx)),
            "div_approx": len(re.findall(r"\bdiv\.approx\.f32\b", ptx))}


def _counts(ops: list[str], prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for op in ops:
        if op.startswith(prefix):
            out[op] = out.get(op, 0) + 1
    return out


def report(*, sass_dir: Path | None = None, everything: bool = False) -> list[dict[str, Any]]:
    """One row per dtype and activation."""
    return [compile_one(dtype, act, sass_dir=sass_dir) for dtype in DTYPES for act in ACTIVATIONS]
