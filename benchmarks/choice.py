"""Which kernel ``get_kernel`` chooses by default for each benchmark case, and whether that
choice met the goal: its time at most ``GOAL``× the fastest kernel that keeps the weight
compressed, measured in the same run.

A suite marks the variants that are registered kernels called as a caller of
``get_kernel`` would call them (``Variant.candidate``: the format they compete for), which of
them keep a dense copy of the weight, and the one ``get_kernel`` returns by default
(``chosen``); :func:`check` reads the rows back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quantcore.errors import NoKernelError
from quantcore.formats.base import Format
from quantcore.problem import Problem
from quantcore.registry import default_registry
from quantcore.selection import get_kernel

__all__ = ["GOAL", "check", "default_choice", "keeps_dense"]

#: The default's time over the fastest compressed kernel's, at most.
GOAL = 1.15


def default_choice(fmt: Format, device: str, problem: Problem) -> str | None:
    """The kernel ``get_kernel`` returns for ``problem`` with no preference or tuning."""
    try:
        return get_kernel(fmt, device, problem=problem).name
    except NoKernelError:
        return None


def keeps_dense(fmt: Format, op: str, kernel: str) -> bool:
    return bool(default_registry().kernel(fmt.name, op, kernel).cls.keeps_dense_weight)


def check(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Per case and format: the default's time against the fastest compressed kernel's.
    Returns note lines for the report and the same as records for the JSON."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("candidate") and r["role"] != "skipped":
            groups.setdefault((r["case"], r["candidate"]), []).append(r)
    notes, records = [], []
    for (case, fmt), mine in groups.items():
        chosen = next((r for r in mine if r.get("chosen")), None)
        compressed = [r for r in mine if not r.get("keeps_dense")]
        fastest = min(compressed, key=lambda r: r["time_s"]) if compressed else None
        label = f"{case} {fmt}" if len({g[1] for g in groups}) > 1 else case
        if chosen is None:
            notes.append(f"{label}: the default choice was not timed here")
            records.append({"case": case, "format": fmt, "chosen": None, "met": False})
            continue
        if fastest is None:
            notes.append(f"{label}: default {chosen['variant']} (nothing that keeps the weight compressed runs here)")
            records.append({"case": case, "format": fmt, "chosen": chosen["variant"], "fastest": None,
                            "ratio": None, "met": True})
            continue
        ratio = chosen["time_s"] / fastest["time_s"]
        met = ratio <= GOAL
        notes.append(f"{label}: default {chosen['variant']} {ratio:.2f}× the fastest compressed kernel "
                     f"({fastest['variant']}) (goal ≤ {GOAL}×): {'met' if met else 'MISSED'}")
        records.append({"case": case, "format": fmt, "chosen": chosen["variant"], "fastest": fastest["variant"],
                        "ratio": ratio, "met": met})
    return notes, records
