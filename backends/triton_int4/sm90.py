"""Compile the kernels for Hopper (sm_90a) on any machine, no GPU needed, and read what
the compiler made: registers, spill stack, shared memory, and the SASS of the main loop —
its instructions per weight (the dequantization's cost: the kernels must stay memory-
bound), its opcode mix (16-byte loads? tensor-core ops: HGMMA or HMMA?).

    python -m quantcore.backends.triton_int4.sm90 [--sass NAME]

Triton compiles for an explicit ``GPUTarget`` with its bundled ptxas, and its bundled
``cuobjdump`` reads the cubin. Needs ``TRITON_INTERPRET`` unset.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .configs import GemvConfig, MmaConfig

__all__ = ["compile_kernel", "loop_profile"]

_DT = {"bf16": "*bf16", "fp16": "*fp16"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _tool(name: str) -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def _loop(sass: str) -> list[str]:
    """Opcodes of the longest backward-branch loop (the walk over K)."""
    ins = re.findall(r"/\*([0-9a-f]{4,5})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)\s*([^;]*);", sass)
    loops = []
    for addr, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest)
        if op.startswith("BRA") and target and int(target.group(1), 16) < int(addr, 16):
            loops.append((int(target.group(1), 16), int(addr, 16)))
    if not loops:
        return []
    lo, hi = max(loops, key=lambda span: span[1] - span[0])
    return [op for addr, op, _ in ins if lo <= int(addr, 16) <= hi]


def loop_profile(sass: str, weights_per_iteration: int, threads: int) -> dict[str, Any]:
    ops = _loop(sass)
    hist = collections.Counter(op.split(".")[0] for op in ops)
    wide = sum(1 for op in ops if op.startswith("LDG") and ".128" in op)
    per_weight = len(ops) * threads / max(weights_per_iteration, 1)
    return {"loop_instructions": len(ops), "instr_per_weight": round(per_weight, 2), "ldg128": wide,
            "top": dict(hist.most_common(12))}


def compile_kernel(path: str, cfg: GemvConfig | MmaConfig, *, bits: int = 4, k: int = 4096, n: int = 4096,
                   sg: int = 128, close: int | None = None, dtype: str = "bf16", zeros: bool = False,
                   bias: bool = False, asm: bool = True) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import kernels

    pairs = 16 // bits
    blocks = -(-k // (32 * pairs))
    close = close or pairs
    runtime = {"x_ptr": _DT[dtype], "w_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*u8", "map_ptr": "*i32",
               "b_ptr": "*fp16", "y_ptr": _DT[dtype], "ws_ptr": "*fp32", "cnt_ptr": "*i32",
               "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_ym": "i32",
               "NUM_GROUPS": "i32", "NUM_SUB": "i32"}
    const: dict[str, Any] = {"BITS": bits, "SG": sg, "CLOSE": close, "BLOCKS": blocks, "HAS_ZEROS": zeros,
                             "HAS_MAP": False, "HAS_BIAS": bias, "SPLIT_K": cfg.split_k,
                             "EVEN_K": True, "EVEN_N": True, "ASM": asm}
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
    names = list(fn.arg_names)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in runtime if a not in ("M", "NUM_GROUPS", "NUM_SUB")}
    src = ASTSource(fn=fn, signature={**runtime, **{c: "constexpr" for c in const}}, constexprs=const, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([str(_tool("cuobjdump")), "-res-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([str(_tool("cuobjdump")), "-sass", str(cubin)],
                              capture_output=True, text=True, check=True).stdout

    def get(key: str) -> int:
        hit = re.search(rf"{key}:(\d+)", usage)
        return int(hit.group(1)) if hit else -1

    return {"path": path, "config": cfg.__dict__, "bits": bits, "dtype": dtype, "sg": sg, "zeros": zeros,
            "registers": get("REG"), "spill_stack": get("STACK"), "shared": compiled.metadata.shared,
            **loop_profile(sass, weights_per_iteration, cfg.num_warps * 32), "sass": sass}


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


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU target")
    rows = []
    for path, cfg, bits in REPORT:
        row = compile_kernel(path, cfg, bits=bits)
        if "--sass" in argv:
            Path(f"sass-{path}-{bits}b-{'-'.join(map(str, cfg.__dict__.values()))}.txt").write_text(row["sass"])
        del row["sass"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
