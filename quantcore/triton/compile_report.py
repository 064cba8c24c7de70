"""What the compiler makes of a Triton kernel for Hopper (sm_90a), on any machine, no GPU
needed: registers, spill stack, shared memory, and the SASS to count instructions in.

Triton compiles for an explicit ``GPUTarget`` with the ``ptxas`` bundled in its wheel,
and the bundled ``cuobjdump`` reads the cubin. The interpreter replaces kernels by Python
functions, so ``TRITON_INTERPRET`` must be unset. ``tools/compile_report`` drives this
for every Triton kernel of the repository; the tests under ``tests/*/test_sm90_compile.py``
hold the numbers it reports to budgets.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Compiled", "Instruction", "backward_loops", "bundled_tool", "compile_sm90", "innermost",
    "instructions", "longest_inner_loop", "occupancy_sm90", "opcode_counts", "opcodes_in", "tools_available",
    "wgmma_waits",
]

#: Hopper, with the architecture-specific features (wgmma) Triton uses there.
SM90 = ("cuda", 90, 32)


def bundled_tool(name: str) -> Path:
    """A tool of the NVIDIA toolchain bundled in the triton wheel (ptxas, cuobjdump)."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def tools_available() -> bool:
    """Whether triton is installed with its bundled ptxas and cuobjdump (no import of triton)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("triton")
    except (ImportError, ValueError):
        return False
    if spec is None or spec.origin is None:
        return False
    bin_dir = Path(spec.origin).parent / "backends" / "nvidia" / "bin"
    return (bin_dir / "ptxas").exists() and (bin_dir / "cuobjdump").exists()


@dataclass
class Compiled:
    """One kernel compiled for sm_90a: ``cuobjdump -res-usage`` and ``-sass`` of its cubin."""

    registers: int
    spill_stack: int
    shared: int
    sass: str
    asm: Mapping[str, Any] = field(repr=False)
    #: Warps the kernel launches with (a warp-specialised Gluon kernel adds its workers').
    num_warps: int = 0


def compile_sm90(
    fn: Any, signature: Mapping[str, str], constexprs: Mapping[str, Any], *,
    divisible: Iterable[str], options: Mapping[str, Any], gluon: bool = False,
) -> Compiled:
    """Compile ``fn`` (a ``@triton.jit`` function, or with ``gluon`` a ``@gluon.jit`` one)
    for sm_90a. ``signature`` types the runtime arguments (``"*bf16"``, ``"i32"``, …);
    ``divisible`` names those the launcher would specialise as 16-divisible (aligned
    pointers, strides), as it does at run time; ``options`` are the compile options
    (``num_warps``, ``num_stages``, ``maxnreg``, …)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU target")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in divisible}
    full = {**signature, **{k: "constexpr" for k in constexprs}}
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource

        src: Any = GluonASTSource(fn=fn, signature=full, constexprs=dict(constexprs), attrs=attrs)
    else:
        src = ASTSource(fn=fn, signature=full, constexprs=dict(constexprs), attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget(*SM90), options=dict(options))
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        usage = _cuobjdump("-res-usage", cubin)
        sass = _cuobjdump("-sass", cubin)
    return Compiled(_usage(usage, "REG"), _usage(usage, "STACK"), kernel.metadata.shared, sass, kernel.asm,
                    kernel.metadata.num_warps)


def _cuobjdump(flag: str, cubin: Path) -> str:
    return subprocess.run([str(bundled_tool("cuobjdump")), flag, str(cubin)],
                          capture_output=True, text=True, check=True).stdout


def _usage(report: str, key: str) -> int:
    hit = re.search(rf"{key}:(\d+)", report)
    if hit is None:
        raise RuntimeError(f"cuobjdump -res-usage: expected {key}:<n> in its report, got {report[:200]!r}")
    return int(hit.group(1))


@dataclass(frozen=True)
class Instruction:
    address: int
    #: With its modifiers (``LDG.E.128``); :func:`opcode_counts` drops them.
    opcode: str
    operands: str


# Modifiers may hold lower case (``HGMMA.64x256x16.F32``): the opcode runs to the first space.
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)\s*([^;]*);")


def instructions(sass: str) -> list[Instruction]:
    """The instructions of a ``cuobjdump -sass`` listing, in address order (a predicate
    such as ``@!P0`` is dropped)."""
    return [Instruction(int(a, 16), op, rest) for a, op, rest in _LINE.findall(sass)]


def backward_loops(ins: Sequence[Instruction]) -> list[tuple[int, int]]:
    """``(first, last)`` address of every loop: a branch back to a lower address."""
    spans = []
    for i in ins:
        target = re.search(r"0x([0-9a-f]+)", i.operands)
        if i.opcode.startswith("BRA") and target and int(target.group(1), 16) < i.address:
            spans.append((int(target.group(1), 16), i.address))
    return spans


def innermost(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The loops that hold no other loop."""
    return [a for a in spans if not any(b != a and a[0] <= b[0] and b[1] <= a[1] for b in spans)]


def opcodes_in(ins: Sequence[Instruction], span: tuple[int, int]) -> list[str]:
    """The opcodes (with modifiers) of the instructions within ``span``, both ends included."""
    lo, hi = span
    return [i.opcode for i in ins if lo <= i.address <= hi]


def longest_inner_loop(sass: str) -> list[str]:
    """The opcodes of the longest loop of ``sass`` that holds no other loop (a kernel's
    main walk); empty where it has none."""
    ins = instructions(sass)
    loops = innermost(backward_loops(ins))
    if not loops:
        return []
    return opcodes_in(ins, max(loops, key=lambda span: span[1] - span[0]))


def wgmma_waits(ins: Sequence[Instruction], span: tuple[int, int]) -> dict[str, int]:
    """The warpgroup MMA waits within ``span`` (``WARPGROUP.DEPBAR.LE gsb0, 0xN``: wait until
    at most N committed MMA groups are pending), counted by N: ``{"0": 1}`` is one wait
    for every MMA issued, ``{"7": 8}`` eight that each leave seven in flight."""
    lo, hi = span
    counts: collections.Counter[str] = collections.Counter()
    for i in ins:
        if lo <= i.address <= hi and i.opcode.startswith("WARPGROUP.DEPBAR"):
            bound = re.search(r"0x([0-9a-f]+)", i.operands)
            counts[str(int(bound.group(1), 16)) if bound else "?"] += 1
    return dict(sorted(counts.items()))


def opcode_counts(opcodes: Iterable[str]) -> collections.Counter[str]:
    """How often each opcode occurs, without modifiers (``LDG.E.128`` counts as ``LDG``)."""
    return collections.Counter(op.split(".")[0] for op in opcodes)


#: An sm_90 SM: registers, resident warps and blocks, shared memory (the 1 KB each block
#: reserves included in the 228 KB).
_SM90_REGS, _SM90_WARPS, _SM90_BLOCKS, _SM90_SMEM = 65536, 64, 32, 228 * 1024


def occupancy_sm90(registers: int, warps: int, shared: int) -> int:
    """Blocks of ``warps`` warps, ``registers`` per thread and ``shared`` bytes that one
    Hopper SM holds at once (registers are allocated per warp in units of 256)."""
    per_warp = -(-registers * 32 // 256) * 256
    by_regs = (_SM90_REGS // max(per_warp, 1)) // warps
    by_smem = _SM90_SMEM // (shared + 1024)
    return max(0, min(by_regs, _SM90_WARPS // warps, _SM90_BLOCKS, by_smem))
