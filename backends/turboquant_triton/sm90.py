"""Compile the TurboQuant Triton kernels for Hopper (sm_90) on any machine, no GPU needed,
and read the compiler's resource report and the SASS: registers, spill stack, shared
memory, instruction counts.

    python -m quantcore.backends.turboquant_triton.sm90 [--all] [--sass]

Triton compiles to a cubin for an explicit ``GPUTarget`` with its bundled ptxas;
``cuobjdump`` (bundled too) reads the cubin. This is how the configurations in
``configs.py`` were checked before a GPU ran them: each must compile for sm_90 without
spilling, and the decode kernel's hot loop is counted in instructions per weight
(``loop_instructions``, the body of the longest backward branch). Needs
``TRITON_INTERPRET`` unset (the interpreter replaces the kernels by Python functions).
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

__all__ = ["compile_report", "sass_histogram"]

_GEMV_PTRS = {"x_ptr": "*bf16", "x2_ptr": "*bf16", "idx_ptr": "*i32", "scale_ptr": "*fp32", "rot_ptr": "*bf16",
              "idx2_ptr": "*i32", "scale2_ptr": "*fp32", "rot2_ptr": "*bf16", "cb_ptr": "*fp32", "out_ptr": "*bf16",
              "partial_ptr": "*fp32", "bias_ptr": "*fp32", "ws_ptr": "*fp32", "ticket_ptr": "*i32"}
_MMA_PTRS = {"x_ptr": "*bf16", "x2_ptr": "*bf16", "idx_ptr": "*i32", "scale_ptr": "*fp32", "idx2_ptr": "*i32",
             "scale2_ptr": "*fp32", "cb_ptr": "*fp32", "out_ptr": "*bf16", "partial_ptr": "*fp32",
             "bias_ptr": "*fp32", "ws_ptr": "*fp32", "ticket_ptr": "*i32"}
_DEQ_PTRS = {"idx_ptr": "*i32", "scale_ptr": "*fp32", "cb_ptr": "*fp32", "out_ptr": "*bf16"}


def _tool(name: str) -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def sass_histogram(sass: str) -> collections.Counter[str]:
    """Opcode counts (without modifiers) of a ``cuobjdump -sass`` listing."""
    count: collections.Counter[str] = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            count[m.group(2).split(".")[0]] += 1
    return count


def _loop_body(sass: str) -> collections.Counter[str]:
    """Opcodes of the longest loop (the decode kernel's row walk)."""
    lines = [ln for ln in sass.splitlines() if re.search(r"/\*[0-9a-f]{4,}\*/", ln)]
    addr = [int(re.search(r"/\*([0-9a-f]{4,})\*/", ln).group(1), 16) for ln in lines]  # type: ignore[union-attr]
    best: tuple[int, int, int] | None = None
    for ln, at in zip(lines, addr, strict=True):
        m = re.search(r"BRA\s+0x([0-9a-f]+)", ln)
        if m and int(m.group(1), 16) < at:
            lo = int(m.group(1), 16)
            size = sum(1 for a in addr if lo <= a <= at)
            if best is None or size > best[0]:
                best = (size, lo, at)
    if best is None:
        return collections.Counter()
    return sass_histogram("\n".join(ln for ln, a in zip(lines, addr, strict=True) if best[1] <= a <= best[2]))


def _compile(fn: Any, runtime: dict[str, str], const: dict[str, Any], warps: int, stages: int,
             dump: str | None = None) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    # What the launcher would assume for 16-aligned pointers and strides.
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in runtime if a not in ("M",)}
    src = ASTSource(fn=fn, signature={**runtime, **{k: "constexpr" for k in const}}, constexprs=const, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        usage = subprocess.run([str(_tool("cuobjdump")), "-res-usage", str(cubin)],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([str(_tool("cuobjdump")), "-sass", str(cubin)],
                              capture_output=True, text=True, check=True).stdout
    if dump:
        Path(dump).write_text(sass)
    get = lambda key: int(re.search(rf"{key}:(\d+)", usage).group(1))  # noqa: E731
    return {"registers": get("REG"), "spill_stack": get("STACK"), "shared": kernel.metadata.shared,
            "sass": sass}


def compile_report(*, everything: bool = False, sass_dir: str | None = None) -> list[dict[str, Any]]:
    """One row per kernel variant: the decode kernel at its default and shipped geometries
    (K = 4096, d = 128; one and two passes), the tensor-core kernel at its M tiles, the
    dequantization kernel."""
    from . import configs, dequant, gemv, mma

    rows = []
    gemv_cfgs = {configs.GemvConfig(), configs.gemv_config("", 4096, 14336, 128, 2, "bfloat16")}
    gemv_cfgs |= {c for c in configs.table().values() if isinstance(c, configs.GemvConfig)}
    for cfg in sorted(gemv_cfgs, key=str):
        for two in ((False, True) if everything else (False,)):
            if two and cfg.unroll > 1:
                continue  # the two-pass kernels run unrolled once (registers): their own config
            const = dict(N_GROUPS=32, D=128, GPC=cfg.gpc, SPLIT=32 // cfg.gpc, SPLIT_P2=32 // cfg.gpc,
                         ROWS_CTA=14 * cfg.br, BR=cfg.br, TAIL=128, UNROLL=cfg.unroll,
                         TWO_PASSES=two, X_ROTATED=False, HAS_PARTIAL=True, HAS_BIAS=True, DOT_FP32=False,
                         INTERPRET=False)
            runtime = {**_GEMV_PTRS, "N": "i32", "stride_idx": "i32", "stride_idx2": "i32"}
            dump = f"{sass_dir}/gemv-{cfg.gpc}-{cfg.br}-{cfg.warps}-{int(two)}.sass" if sass_dir else None
            res = _compile(gemv.gemv_kernel, runtime, const, cfg.warps, 1, dump)
            loop = _loop_body(res.pop("sass"))
            # weights a thread handles in one pass of the loop body (unrolled steps)
            weights = cfg.unroll * cfg.br * cfg.gpc * 128 * (2 if two else 1) / (32 * cfg.warps)
            rows.append({"kernel": "gemv", "passes": 1 + two, **cfg.__dict__, **res,
                         "loop_instructions_per_weight": round(sum(loop.values()) / weights, 2),
                         "loop_lds_per_weight": round(loop["LDS"] / weights, 2)})
    mma_cfgs = {configs.mma_config("", m, 4096, 14336, 128, 1, "bfloat16") for m in (16, 32, 64)}
    mma_cfgs |= {c for c in configs.table().values() if isinstance(c, configs.MmaConfig)}
    for cfg in sorted(mma_cfgs, key=str):
        const = dict(N_GROUPS=32, D=128, GPC=cfg.gpc, SPLIT=2, BLOCK_N=cfg.block_n, BLOCK_M=cfg.block_m,
                     TWO_PASSES=everything, HAS_PARTIAL=True, HAS_BIAS=True, DOT_FP32=False, INTERPRET=False)
        runtime = {**_MMA_PTRS, "M": "i32", "N": "i32", "stride_idx": "i32", "stride_idx2": "i32"}
        res = _compile(mma.mma_kernel, runtime, const, cfg.warps, cfg.stages)
        hist = sass_histogram(res.pop("sass"))
        rows.append({"kernel": "mma", **cfg.__dict__, **res, "wgmma": hist["HGMMA"], "mma_sync": hist["HMMA"]})
    const = dict(N_GROUPS=32, D=128, BLOCK_N=32, GPC=2, PASSES=2, INTERPRET=False)
    runtime = {**_DEQ_PTRS, "N": "i32", "stride_idx": "i32", "stride_out": "i32", "col0": "i32"}
    res = _compile(dequant.dequant_kernel, runtime, const, 4, 1)
    res.pop("sass")
    rows.append({"kernel": "dequant", "block_n": 32, "gpc": 2, **res})
    return rows


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU target")
    sass_dir = sys.argv[sys.argv.index("--sass") + 1] if "--sass" in sys.argv else None
    json.dump(compile_report(everything="--all" in sys.argv, sass_dir=sass_dir), sys.stdout, default=str)
