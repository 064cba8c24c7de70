"""Compile ``hopper_wgmma`` for sm_90a on any machine (no GPU) and read what the compiler
made: registers, spill stack, shared memory, and in the main loop the HGMMAs, the
``WARPGROUP.DEPBAR`` waits (how many wgmma groups stay in flight), barriers (CTA-wide, or
named over a warp-specialised partition's warps; the producer's ``setmaxnreg``), shared and
global load widths, and instructions per weight code; and ``hazards``, the writes to a
register an in-flight HGMMA still reads (``hopper_wgmma_hazards.py``), which must be 0.

    python -m tools.probes.hopper_wgmma_sass [--sass DIR]

Triton compiles for an explicit ``GPUTarget`` with its bundled ptxas; its bundled
``cuobjdump`` reads the cubin. The launch arguments are built by the launcher itself on
CPU tensors of the right shapes, so the probe compiles what a call would run.
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path
from typing import Any

import torch

from quantcore.backends.hopper_wgmma.layout import GPTQToHopper
from quantcore.backends.hopper_wgmma.plans import Plan
from quantcore.formats.gptq import GPTQ
from quantcore.triton.compile_report import compile_sm90

from .hopper_wgmma_hazards import operand_hazards

__all__ = ["compile_plan", "loop_profile"]


def _loop(sass: str, holding: str = "HGMMA", without: str | None = None) -> list[str]:
    """Instructions (opcode and operands) of the backward-branch loop holding the most
    ``holding`` instructions (HGMMA: the walk over K), among those with no ``without``."""
    ins = re.findall(r"/\*([0-9a-f]{4,5})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)\s*([^;]*);", sass)
    best: list[str] = []

    def count(body: list[str], op: str) -> int:
        return sum(o.startswith(op) for o in body)

    for addr, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest)
        if op.startswith("BRA") and target and int(target.group(1), 16) < int(addr, 16):
            lo, hi = int(target.group(1), 16), int(addr, 16)
            body = [f"{o} {r}".strip() for a, o, r in ins if lo <= int(a, 16) <= hi]
            if (without is None or not count(body, without)) and count(body, holding) > count(best, holding):
                best = body
    return best


def _barriers(body: list[str]) -> tuple[int, list[int]]:
    """(CTA-wide ``BAR.SYNC``s, thread counts of the named barriers over part of the CTA:
    ``BAR.SYNC id, threads``, which a warp-specialised partition's compiler barriers are)."""
    cta, named = 0, []
    for line in body:
        if line.startswith("BAR.SYNC"):
            args = line.split(None, 1)[1].split(",") if " " in line else []
            if len(args) > 1:
                named.append(int(args[1], 0))
            else:
                cta += 1
    return cta, named


def loop_profile(sass: str, codes_per_iteration: int, threads: int) -> dict[str, Any]:
    body = _loop(sass)
    ops = [line.split()[0] for line in body]
    hist = collections.Counter(op.split(".")[0] for op in ops)
    cta, named = _barriers(body)
    return {
        "loop_instructions": len(ops),
        "instr_per_code": round(len(ops) * threads / max(codes_per_iteration, 1), 2),
        "hgmma": sum(op.startswith("HGMMA") for op in ops),
        "depbar": [line for line in body if line.startswith("WARPGROUP.DEPBAR")],
        "bar_sync": sum(op.startswith("BAR.SYNC") for op in ops),
        "bar_cta": cta,
        "bar_named": named,
        "lds128": sum(op.startswith("LDS") and ".128" in op for op in ops),
        "ldg": sum(op.startswith("LDG") for op in ops),
        "tma": sum(op.startswith("UTMALDG") for op in ops),
        "top": dict(hist.most_common(14)),
    }


def _weights(bits: int, k: int, n: int, group: int, sym: bool) -> Any:
    fmt = GPTQ(bits=bits, group_size=group, sym=sym)
    gen = torch.Generator().manual_seed(0)
    return GPTQToHopper(fmt).apply(fmt.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen))


def compile_plan(plan: Plan, *, bits: int = 4, m: int = 1, k: int = 4096, n: int = 4096, group: int = 128,
                 sym: bool = True, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    from triton.runtime.jit import mangle_type

    from quantcore.backends.hopper_wgmma.kernels import wgmma_kernel
    from quantcore.backends.hopper_wgmma.launch import kernel_args, prepare_x

    w = _weights(bits, k, n, group, sym)
    x = prepare_x(torch.zeros(m, k, dtype=dtype))
    y = torch.zeros(m, n, dtype=dtype)
    ws = torch.zeros(4, dtype=torch.float32)
    cnt = torch.zeros(4, dtype=torch.int32)
    _, args, const = kernel_args(x, w, plan, y, ws, cnt)
    num_warps = const.pop("num_warps")
    options = {"num_warps": num_warps, **({"maxnreg": const.pop("maxnreg")} if "maxnreg" in const else {})}
    names = [a for a in wgmma_kernel.arg_names if a not in const]
    signature = {name: mangle_type(arg) for name, arg in zip(names, args, strict=True)}
    compiled = compile_sm90(wgmma_kernel, signature, const, divisible=[], options=options, gluon=True)
    sass = compiled.sass

    codes = 64 * plan.wg * 512 // bits
    hazards = operand_hazards(sass)
    producer = _loop(sass, "UTMALDG", without="HGMMA")
    return {"plan": plan.__dict__, "bits": bits, "dtype": str(dtype).removeprefix("torch."), "group": group,
            "sym": sym, "registers": compiled.registers, "spill_stack": compiled.spill_stack, "shared": compiled.shared,
            "warps": compiled.num_warps,
            # setmaxnreg: a warp-specialised kernel hands the producer warp's registers to the consumers.
            "setmaxnreg": re.findall(r"USETMAXREG\.[A-Z_.]+ (?:U?P\w+, )?(0x[0-9a-f]+)", sass),
            **loop_profile(sass, codes, 128 * plan.wg), "producer_loop_instructions": len(producer),
            "hazards": len(hazards), "first_hazards": [h.__dict__ for h in hazards[:4]], "sass": sass}


#: What the report compiles: the decode, middle and prefill tiles at 4 and 8 bits, each
#: group waited for at a block's end, or left in flight.
REPORT: list[tuple[Plan, dict[str, Any]]] = [
    (Plan(1, 16, 4, 4), {}),
    (Plan(1, 16, 4, 4), {"sym": False}),
    (Plan(1, 16, 4, 4), {"dtype": torch.float16}),
    (Plan(1, 16, 4, 4), {"group": 32}),
    (Plan(1, 16, 4, 4), {"bits": 8}),
    (Plan(1, 16, 4, 4), {"bits": 8, "dtype": torch.float16}),
    (Plan(1, 64, 4, 2), {}),
    (Plan(1, 128, 4, 1), {}),
    (Plan(2, 128, 4, 1), {}),
    (Plan(2, 256, 3, 1), {}),
    (Plan(2, 256, 3, 1), {"sym": False}),
    (Plan(1, 16, 4, 4, in_flight=True), {}),
    (Plan(1, 16, 4, 4, in_flight=True), {"bits": 8}),
    (Plan(1, 64, 4, 2, in_flight=True), {"group": 32, "sym": False}),
    (Plan(2, 128, 4, 1, in_flight=True), {}),
    (Plan(2, 128, 4, 1, in_flight=True), {"bits": 8, "dtype": torch.float16}),
    (Plan(2, 256, 3, 1, in_flight=True), {}),
    (Plan(2, 256, 3, 1, in_flight=True), {"sym": False}),
    (Plan(1, 128, 4, 1, in_flight=True, ws=True), {"group": 32, "dtype": torch.float16}),
    (Plan(2, 128, 4, 1, in_flight=True, ws=True), {"sym": False}),
    (Plan(2, 256, 3, 1, in_flight=True, ws=True), {}),
]


def main(argv: list[str]) -> int:
    out = Path(argv[argv.index("--sass") + 1]) if "--sass" in argv else None
    for plan, kw in REPORT:
        row = compile_plan(plan, **kw)
        sass = row.pop("sass")
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            tag = "-".join(f"{a}{b}" for a, b in plan.__dict__.items()) + "".join(f"-{a}{b}" for a, b in kw.items())
            (out / f"sass-{tag}.txt").write_text(sass)
        print(json.dumps(row | {"variant": {a: str(b) for a, b in kw.items()}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
