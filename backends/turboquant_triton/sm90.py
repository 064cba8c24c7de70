"""Compile the fused kernels for Hopper (sm_90) on any machine, no GPU needed, and read
the compiler's resource report: registers, spill stack, shared memory.

    python -m quantcore.backends.turboquant_triton.sm90 [--all]

Triton compiles to a cubin for an explicit ``GPUTarget`` with its bundled ptxas, and
``cuobjdump -res-usage`` (bundled too) reads the cubin. This is how the autotuning
configurations beside the kernels were chosen without a GPU: each must compile for
sm_90 without spilling registers to local memory. Needs ``TRITON_INTERPRET`` unset
(the interpreter replaces the kernels by Python functions).
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

__all__ = ["compile_report"]

_POINTERS = {"x_ptr": "*bf16", "idx_ptr": "*u8", "scale_ptr": "*fp32", "cb_ptr": "*fp32",
             "out_ptr": "*bf16", "partial_ptr": "*fp32", "bias_ptr": "*fp32"}


def _tool(name: str) -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def _compile(fn: Any, runtime: dict[str, str], const: dict[str, Any], warps: int, stages: int) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    # What the launcher would assume for 16-aligned pointers and strides.
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in runtime if a not in ("M", "M_BUCKET")}
    src = ASTSource(fn=fn, signature={**runtime, **{k: "constexpr" for k in const}}, constexprs=const, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([str(_tool("cuobjdump")), "-res-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
    get = lambda key: int(re.search(rf"{key}:(\d+)", usage).group(1))  # noqa: E731
    return {"registers": get("REG"), "spill_stack": get("STACK"), "shared": kernel.metadata.shared}


def compile_report(*, everything: bool = False) -> list[dict[str, Any]]:
    """One row per autotuning config (every one with ``everything``, else a sample)."""
    from . import fused

    rows = []
    gemv = fused.GEMV_CONFIGS if everything else fused.GEMV_CONFIGS[::3]
    gemm = fused.GEMM_CONFIGS if everything else fused.GEMM_CONFIGS[::3]
    for cfg in gemv:
        const = {"N_GROUPS": 32, "HALF": 64, "LEVELS": 16, "HAS_PARTIAL": True, "HAS_BIAS": True, **cfg.kwargs}
        runtime = {**_POINTERS, "N": "i32", "K": "i32", "stride_idx": "i32"}
        rows.append({"kernel": "gemv", **cfg.kwargs, **_compile(fused._gemv_body, runtime, const, cfg.num_warps, cfg.num_stages)})
    for cfg in gemm:
        const = {"N_GROUPS": 32, "HALF": 64, "LEVELS": 16, "HAS_PARTIAL": True, "HAS_BIAS": True,
                 "DOT_FP32": False, **cfg.kwargs}
        runtime = {**_POINTERS, "M": "i32", "N": "i32", "K": "i32", "stride_idx": "i32", "M_BUCKET": "i32"}
        rows.append({"kernel": "gemm", **cfg.kwargs, **_compile(fused._gemm_body, runtime, const, cfg.num_warps, cfg.num_stages)})
    return rows


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU target")
    json.dump(compile_report(everything="--all" in sys.argv), sys.stdout, default=str)
