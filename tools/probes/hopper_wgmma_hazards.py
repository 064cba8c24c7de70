"""Registers that an in-flight HGMMA still reads, overwritten before the wait that retires it.

A register-operand ``wgmma`` (SASS ``HGMMA``) reads its A registers asynchronously: until a
``WARPGROUP.DEPBAR.LE gsb0, N`` that leaves in flight only groups committed after it,
nothing may write them, nor its accumulator (except the HGMMAs chained on it). This reads
a ``cuobjdump -sass`` listing and reports every such write on any path of the control
flow (``backends/hopper_wgmma/README.md``: a plan that broke this computed wrong).

Model: a group ends at an HGMMA carrying ``gsb0`` (``wgmma.commit_group``); a
``DEPBAR.LE gsb0, N`` retires every group but the last ``N`` committed. From each HGMMA
every path is followed — branches both ways, loops around — until the HGMMA's group is
retired; a state (instruction, groups committed since) is visited once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Hazard", "Instr", "operand_hazards", "parse_sass"]

_LINE = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)\s*([^;]*);")
_REG = re.compile(r"^R(\d+)$")
# Opcodes whose first register operand is read, not written (stores, reductions,
# control flow, barriers, TMA).
_NO_DEST = ("ST", "STS", "STG", "STL", "RED", "REDG", "BRA", "BAR", "EXIT", "RET", "CALL", "BSYNC", "BSSY",
            "WARPSYNC", "UTMALDG", "UTMASTG", "UTMAPF", "MEMBAR", "FENCE", "NOP", "DEPBAR", "WARPGROUP",
            "CCTL", "ERRBAR", "SYNCS", "R2UR", "R2P", "JMP", "BRX")


@dataclass(frozen=True)
class Instr:
    addr: int
    predicated: bool
    op: str
    operands: tuple[str, ...]
    text: str

    @property
    def base(self) -> str:
        return self.op.split(".")[0]


@dataclass(frozen=True)
class Hazard:
    """``writer`` (at ``writer_addr``) writes ``register``, which the HGMMA at ``hgmma_addr``
    reads (``role``: ``"A"`` or ``"acc"``) while its group may be in flight."""

    hgmma_addr: int
    writer_addr: int
    register: int
    role: str
    writer: str


def parse_sass(sass: str) -> list[Instr]:
    out = []
    for m in _LINE.finditer(sass):
        ops = tuple(o.strip() for o in m.group(4).split(",") if o.strip())
        text = m.group(0).split("*/", 1)[1].strip()
        out.append(Instr(int(m.group(1), 16), m.group(2) is not None, m.group(3), ops, text))
    return out


def _width(ins: Instr) -> int:
    op = ins.op
    if ".128" in op:
        return 4
    if ins.base == "LDSM":  # LDSM.16.M88.4: four 8x8 matrices, one register each; no count: one
        tail = op.rsplit(".", 1)[-1]
        return int(tail) if tail.isdigit() else 1
    if ".64" in op or ".WIDE" in op or ins.base in ("DADD", "DMUL", "DFMA") or ".F64" in op:
        return 2
    if ins.base == "CS2R":
        return 1 if ".32" in op else 2
    return 1


def _hgmma_shape(ins: Instr) -> tuple[int, int]:
    """(first A register or -1 when A is in shared memory, accumulator registers)."""
    m = re.search(r"\.64x(\d+)x\d+\.(F32|F16)", ins.op)
    n = int(m.group(1)) if m else 256
    acc = n // 2 if (m is None or m.group(2) == "F32") else n // 4
    a = _REG.match(ins.operands[1]) if len(ins.operands) > 1 else None
    return (int(a.group(1)) if a else -1), acc


def _written(ins: Instr) -> range:
    """Registers the instruction writes (empty if none)."""
    if ins.base in _NO_DEST or not ins.operands:
        return range(0)
    first = ins.operands[0]
    if ins.base in ("SHFL", "ATOM", "ATOMG", "ATOMS") and first.startswith("P") and len(ins.operands) > 1:
        first = ins.operands[1]
    m = _REG.match(first.split(".")[0])
    if not m:
        return range(0)
    r = int(m.group(1))
    if ins.base == "HGMMA":
        return range(r, r + _hgmma_shape(ins)[1])
    return range(r, r + _width(ins))


def _commits(ins: Instr) -> bool:
    return ins.base == "HGMMA" and "gsb0" in ins.operands


def _depbar_count(ins: Instr) -> int | None:
    if ins.op.startswith("WARPGROUP.DEPBAR"):
        return int(ins.operands[-1], 0)
    return None


def _successors(code: list[Instr], index: dict[int, int], i: int) -> list[int]:
    ins = code[i]
    nxt = [i + 1] if i + 1 < len(code) else []
    if ins.base in ("EXIT", "RET") and not ins.predicated:
        return []
    if ins.base in ("BRA", "JMP"):
        target = re.match(r"0x([0-9a-f]+)", ins.operands[-1]) if ins.operands else None
        to = [index[int(target.group(1), 16)]] if target and int(target.group(1), 16) in index else []
        return to + nxt if ins.predicated else to
    return nxt


#: Groups committed after an HGMMA beyond which the count no longer matters.
_MOST = 16


def _hazards_of(code: list[Instr], index: dict[int, int], start: int) -> list[Hazard]:
    """Every write, on any path from the HGMMA at ``start``, before its group retires."""
    hgmma = code[start]
    a, acc_n = _hgmma_shape(hgmma)
    a_regs = set(range(a, a + 4)) if a >= 0 else set()
    acc0 = _REG.match(hgmma.operands[0])
    acc_regs = set(range(int(acc0.group(1)), int(acc0.group(1)) + acc_n)) if acc0 else set()
    found = []
    todo = [(s, _commits(hgmma), 0) for s in _successors(code, index, start)]
    seen = set(todo)
    while todo:
        i, committed, after = todo.pop()
        ins = code[i]
        n = _depbar_count(ins)
        if n is not None and committed and after >= n:
            continue  # retired on this path
        if _commits(ins):
            after = min(after + 1, _MOST) if committed else after
            committed = True
        if ins.base != "HGMMA":  # chained HGMMAs write the accumulator in order
            for r in _written(ins):
                role = "A" if r in a_regs else "acc" if r in acc_regs else None
                if role:
                    found.append(Hazard(hgmma.addr, ins.addr, r, role, ins.text))
        for s in _successors(code, index, i):
            state = (s, committed, after)
            if state not in seen:
                seen.add(state)
                todo.append(state)
    return found


def operand_hazards(sass: str) -> list[Hazard]:
    """Every write to a register an HGMMA may still be reading (empty: none)."""
    code = parse_sass(sass)
    index = {ins.addr: i for i, ins in enumerate(code)}
    found = []
    for i, ins in enumerate(code):
        if ins.base == "HGMMA":
            found += _hazards_of(code, index, i)
    return sorted(set(found), key=lambda h: (h.hgmma_addr, h.writer_addr, h.register))
