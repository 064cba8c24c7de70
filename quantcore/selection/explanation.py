"""What a choice says about itself: every candidate with its status and reason
(:class:`Explanation`), and the table ``quantcore explain`` prints from it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tabulate import tabulate

__all__ = ["BROKEN", "DISABLED", "REFUSED", "SELECTED", "USABLE", "Candidate", "Explanation"]

SELECTED, USABLE, REFUSED, DISABLED, BROKEN = "selected", "usable", "refused", "disabled", "broken"


@dataclass(frozen=True)
class Candidate:
    kernel: str
    plugin: str
    priority: int
    status: str
    reason: str = ""
    #: Median seconds per call, measured (``tune=True``, or a cached or shipped table).
    measured_s: float | None = None
    #: Seconds per call estimated from the kernel's declared cost.
    estimated_s: float | None = None
    #: The kernel keeps a dense copy of the weight (``Kernel.keeps_dense_weight``).
    keeps_dense: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "kernel": self.kernel,
            "plugin": self.plugin,
            "priority": self.priority,
            "status": self.status,
            "reason": self.reason,
            "measured_s": self.measured_s,
            "estimated_s": self.estimated_s,
            "keeps_dense": self.keeps_dense,
        }


@dataclass(frozen=True)
class Explanation:
    """Every candidate for a request, chosen or refused, and why. ``str()`` is the table."""

    format: str
    device: str
    problem: str
    candidates: tuple[Candidate, ...] = field(default=())
    #: What ordered the usable candidates: measured times, declared costs or priorities.
    basis: str = ""
    #: The kernel chosen at each batch size (``explain`` sweeps them; empty otherwise):
    #: how the shape moves the choice.
    by_batch: tuple[tuple[int, str | None], ...] = ()
    batch_dim: str = "M"

    @property
    def selected(self) -> Candidate | None:
        for c in self.candidates:
            if c.status == SELECTED:
                return c
        return None

    def as_dict(self) -> dict[str, object]:
        return {
            "format": self.format,
            "device": self.device,
            "problem": self.problem,
            "selected": self.selected.kernel if self.selected else None,
            "basis": self.basis,
            "by_batch": [{"batch": b, "selected": k} for b, k in self.by_batch],
            "candidates": [c.as_dict() for c in self.candidates],
        }

    def table(self) -> str:
        head = f"{self.format} on {self.device}" + (f" for {self.problem}" if self.problem else "")
        if not self.candidates:
            return f"{head}: no kernel is registered for this format"
        estimated = any(c.estimated_s is not None for c in self.candidates)
        timed = any(c.measured_s is not None for c in self.candidates)
        dense = any(c.keeps_dense and c.status in (SELECTED, USABLE) for c in self.candidates)
        headers = ["kernel", "plugin", "priority", "status", *(["est. µs"] if estimated else []),
                   *(["measured µs"] if timed else []), *(["weight"] if dense else []), "reason"]
        rows = [
            [c.kernel, c.plugin, c.priority, c.status,
             *([_us(c.estimated_s)] if estimated else []), *([_us(c.measured_s)] if timed else []),
             *([("dense copy" if c.keeps_dense else "compressed") if c.status in (SELECTED, USABLE) else ""]
               if dense else []),
             c.reason]
            for c in self.candidates
        ]
        lines = [head, tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)]
        if self.basis:
            lines.append(f"ranked by {self.basis}")
        if self.by_batch:
            lines.append(f"chosen by {self.batch_dim} (other dims as given): " + _ranges(self.by_batch, self.batch_dim))
        return "\n".join(lines)

    __str__ = table


def _us(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return "inf" if math.isinf(seconds) else f"{seconds * 1e6:.1f}"


def _ranges(by_batch: Sequence[tuple[int, str | None]], dim: str) -> str:
    """``M=1–4 aten_cuda · M=8–4096 triton_int4``."""
    runs: list[tuple[int, int, str | None]] = []
    for b, k in by_batch:
        if runs and runs[-1][2] == k:
            runs[-1] = (runs[-1][0], b, k)
        else:
            runs.append((b, b, k))
    return " · ".join(f"{dim}={lo}" + (f"–{hi}" if hi != lo else "") + f" {k or 'none'}" for lo, hi, k in runs)
