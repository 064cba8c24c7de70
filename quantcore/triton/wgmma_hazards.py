"""Register-operand wgmma hazards in compiled Hopper code (SASS), found without a GPU.

A ``wgmma.mma_async`` whose A operand sits in registers reads those registers
asynchronously: the PTX rules say they must not be written until a ``wgmma.wait_group``
covering that wgmma has returned. Triton 3.6 pipelines such dots by splitting one
``tl.dot`` along K into several wgmmas and waiting with ``pendings = count − 1``, which
only guarantees that the *first* of the previous step's wgmmas has finished; the next
step's operand computation may then write registers that a later, still-pending wgmma
reads. Whether that happens is ptxas's register allocation — the same source compiled
for bf16 scales kept each operand set apart, for fp16 scales it did not — and when it
happens the results are wrong, more often the longer the wgmmas run (wide N tiles).

This module finds it in a ``cuobjdump -sass`` listing (:mod:`quantcore.triton.compile_report`
compiles one on any machine): in every innermost loop holding ``HGMMA``, it follows the
instructions twice round (the second pass sees the registers the previous iteration's
wgmmas still read), keeps the wgmmas issued and not yet covered by a
``WARPGROUP.DEPBAR.LE gsb0, N`` (which retires all but the N most recent), and reports
every instruction that writes one of their A registers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .compile_report import Instruction, backward_loops, innermost, instructions

__all__ = ["Hazard", "destination_registers", "register_operand_hazards"]

_HGMMA_A = re.compile(r"^R\d+\s*,\s*R(\d+)\s*,")
_FIRST_REG = re.compile(r"^R(\d+)\b")
_WAIT = re.compile(r"gsb0\s*,\s*0x([0-9a-f]+)")


@dataclass(frozen=True)
class Hazard:
    """``writer`` writes ``registers``, which the wgmma at ``wgmma`` may still be reading."""

    wgmma: int  # its address
    writer: int  # the writing instruction's address
    text: str  # the writing instruction
    registers: tuple[int, ...]


def destination_registers(ins: Instruction) -> tuple[int, ...]:
    """The general registers an instruction writes, read from its first operand: widened
    for 64- and 128-bit results and for ``LDSM`` of 2 or 4 matrices. Stores, barriers,
    branches and instructions whose first operand is a predicate or uniform register
    write none here. (An ``HGMMA`` writes its accumulators, never an A operand.)"""
    op = ins.opcode
    if op.startswith(("ST", "RED", "BAR", "BRA", "WARPGROUP", "DEPBAR", "LDGDEPBAR", "LDGSTS", "HGMMA", "EXIT")):
        return ()
    first = _FIRST_REG.match(ins.operands.strip())
    if first is None:
        return ()
    parts = op.split(".")
    width = 1
    if "128" in parts:
        width = 4
    elif "64" in parts or "WIDE" in parts:
        width = 2
    if parts[0] == "LDSM":
        width = 4 if "4" in parts[1:] else 2 if "2" in parts[1:] else 1
    base = int(first.group(1))
    return tuple(range(base, base + width))


def _loop_hazards(body: Sequence[Instruction]) -> list[Hazard]:
    pending: list[tuple[int, frozenset[int]]] = []  # (address, A registers), oldest first
    found: list[Hazard] = []
    for lap in (0, 1):
        for ins in body:
            if ins.opcode.startswith("WARPGROUP.DEPBAR"):
                wait = _WAIT.search(ins.operands)
                keep = int(wait.group(1), 16) if wait else 0
                del pending[: max(0, len(pending) - keep)]
                continue
            written = set(destination_registers(ins))
            if lap and written:
                for address, regs in pending:
                    if written & regs:
                        found.append(Hazard(address, ins.address, f"{ins.opcode} {ins.operands}".strip(),
                                            tuple(sorted(written & regs))))
            if ins.opcode.startswith("HGMMA"):
                a = _HGMMA_A.match(ins.operands.strip())
                if a is not None:  # an A operand in registers (four of them), not a descriptor
                    pending.append((ins.address, frozenset(range(int(a.group(1)), int(a.group(1)) + 4))))
    return found


def register_operand_hazards(sass: str) -> list[Hazard]:
    """Every write, within an innermost loop holding ``HGMMA``, to an A register of a
    wgmma that no wait has yet covered (empty: the code keeps the PTX rule)."""
    ins = instructions(sass)
    found: list[Hazard] = []
    for lo, hi in innermost(backward_loops(ins)):
        body = [i for i in ins if lo <= i.address <= hi]
        if any(i.opcode.startswith("HGMMA") for i in body):
            found += _loop_hazards(body)
    return found
