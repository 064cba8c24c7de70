"""The ``triton_int4`` kernels for Hopper (sm_90a): registers, spill stack, shared memory,
and the SASS of the main loop — its instructions per weight (the dequantization's cost:
the kernels must stay memory-bound), its opcode mix (16-byte loads? tensor-core ops:
HGMMA or HMMA?). One row per default tile of each path at 4 and 8 bits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantcore.backends.triton_int4.configs import GemvConfig, MmaConfig
from quantcore.triton.compile_report import (
    backward_loops,
    compile_sm90,
    instructions,
    opcode_counts,
    opcodes_in,
)

__all__ = ["REPORT", "compile_kernel", "loop_profile", "report"]

_DT = {"bf16": "*bf16", "fp16": "*fp16"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _loop(sass: str) -> list[str]:
    """Opcodes of the longest loop (the walk over K)."""
    ins = instructions(sass)
    loops = backward_loops(ins)
    if not loops:
        return []
    return opcodes_in(ins, max(loops, key=lambda span: span[1] - span[0]))


def loop_profile(sass: str, weights_per_iteration: int, threads: int) -> dict[str, Any]:
    ops = _loop(sass)
    hist = opcode_counts(ops)
    wide = sum(1 for op in ops if op.startswith("LDG") and ".128" in op)
    per_weight = len(ops) * threads / max(weights_per_iteration, 1)
    return {"loop_instructions": len(ops), "instr_per_weight": round(per_weight, 2), "ldg128": wide,
            "top": dict(hist.most_common(12))}


def compile_kernel(path: str, cfg: GemvConfig | MmaConfig, *, bits: int = 4, k: int = 4096, n: int = 4096,
                   sg: int = 128, close: int | None = None, dtype: str = "bf16", zeros: bool = False,
                   bias: bool = False, asm: bool = True, fragments: bool = False) -> dict[str, Any]:
    """One kernel compiled for sm_90a; ``fragments``: over hopper_wgmma's word order (its
    small-M path) instead of triton_int4's."""
    from quantcore.kernels.gptq_pairs import triton_kernels as kernels

    pairs = 16 // bits
    blocks = -(-k // (32 * pairs))
    close = close or pairs
    runtime = {"x_ptr": _DT[dtype], "w_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*u8", "map_ptr": "*i32",
               "b_ptr": "*fp16", "y_ptr": _DT[dtype], "ws_ptr": "*fp32", "cnt_ptr": "*i32",
               "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32",
               "NUM_GROUPS": "i32", "NUM_SUB": "i32"}
    const: dict[str, Any] = {"BITS": bits, "SG": sg, "CLOSE": close, "BLOCKS": blocks, "HAS_ZEROS": zeros,
                             "HAS_MAP": False, "HAS_BIAS": bias, "SPLIT_K": cfg.split_k,
                             "EVEN_K": True, "EVEN_N": True, "ASM": asm, "FRAGMENTS": fragments}
    if isinstance(cfg, GemvConfig):
        fn = kernels.gemv_kernel
        steps = _cdiv(_cdiv(blocks, cfg.split_k), cfg.block_b)
        const |= {"BLOCK_N": cfg.block_n, "BLOCK_B": cfg.block_b, "STEPS": steps}
        weights_per_iteration = cfg.block_n * cfg.block_b * 32 * pairs
    else:
        fn = kernels.mma_kernel
        runtime["w_ptr"] = "*i16"
        const |= {"BLOCK_N": cfg.block_n, "BLOCK_M": cfg.block_m, "BLOCK_B": cfg.block_b,
                  "STEPS": _cdiv(_cdiv(blocks, cfg.split_k), cfg.block_b), "OPERAND": cfg.operand}
        weights_per_iteration = cfg.block_n * 32 * pairs * cfg.block_b
    compiled = compile_sm90(fn, runtime, const, options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
                            divisible=[a for a in runtime if a not in ("M", "NUM_GROUPS", "NUM_SUB")])
    return {"path": path, "config": cfg.__dict__, "bits": bits, "dtype": dtype, "sg": sg, "zeros": zeros,
            "fragments": fragments,
            "registers": compiled.registers, "spill_stack": compiled.spill_stack, "shared": compiled.shared,
            **loop_profile(compiled.sass, weights_per_iteration, cfg.num_warps * 32), "sass": compiled.sass}


#: What the report compiles: the default tiles of each path at 4 and 8 bits.
REPORT = [
    ("gemv", GemvConfig(16, 8, 1, 4, 2), 4),
    ("gemv", GemvConfig(16, 8, 1, 4, 2), 8),
    ("mma", MmaConfig(128, 16, 1, 4, 3, 1), 4),
    ("mma", MmaConfig(128, 16, 1, 4, 3, 1, 2), 4),
    ("mma", MmaConfig(64, 16, 1, 4, 3, 1), 4),
    ("mma", MmaConfig(128, 64, 1, 4, 3, 1), 4),
    ("mma", MmaConfig(128, 128, 1, 8, 3, 1), 4),
    ("mma", MmaConfig(128, 128, 1, 8, 3, 2), 4),
    ("mma", MmaConfig(128, 256, 1, 8, 3, 2), 4),
    ("mma", MmaConfig(128, 16, 1, 4, 3, 1), 8),
]


def report(*, sass_dir: Path | None = None, everything: bool = False) -> list[dict[str, Any]]:
    rows = []
    for path, cfg, bits in REPORT:
        row = compile_kernel(path, cfg, bits=bits)
        sass = row.pop("sass")
        if sass_dir is not None:
            (sass_dir / f"triton_int4-{path}-{bits}b-{'-'.join(map(str, cfg.__dict__.values()))}.sass").write_text(sass)
        rows.append(row)
    return rows
