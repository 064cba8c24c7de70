"""The matrix as tables (tabulate) and JSON."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from tabulate import tabulate

__all__ = ["counts", "detail_table", "summary_table", "to_json"]


def _rows(results: Iterable[Any]) -> list[Mapping[str, Any]]:
    return [r if isinstance(r, Mapping) else r.as_dict() for r in results]


def family(slug: str) -> str:
    """A format slug's family: its name and bit width (``gptq4-g128-asym`` → ``gptq4``)."""
    return slug.split("-", 1)[0]


def summary_table(results: Iterable[Any], *, group: str = "format", tablefmt: str = "simple") -> str:
    """Formats (rows) × kernels (columns). A cell counts its PASS / FAIL / SKIP over
    shapes and dtypes, with the worst passing error; SKIP and FAIL reasons are listed
    once below the table as numbered notes. ``group="family"`` folds every parameter
    variant of a format into one row (``gptq4``, ``awq4``, …)."""
    rows = _rows(results)
    kernels = sorted({r["kernel"] for r in rows})
    key = family if group == "family" else (lambda slug: slug)
    formats = list(dict.fromkeys(key(r["format"]) for r in rows))
    cells: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        cells[(key(r["format"]), r["kernel"])].append(r)
    notes: dict[str, int] = {}
    table = []
    for fmt in formats:
        line = [fmt]
        for k in kernels:
            line.append(_cell_text(cells.get((fmt, k), []), notes))
        table.append(line)
    out = tabulate(table, headers=[group, *kernels], tablefmt=tablefmt)
    out += "\n\n" + "  ".join(f"{s} {n}" for s, n in counts(rows).items())
    bullet = "" if tablefmt == "simple" else "- "  # one note per line in Markdown too
    if notes:
        out += "\n" + ("\n" if bullet else "") + "\n".join(f"{bullet}[{i}] {reason}" for reason, i in notes.items())
    return out


def _cell_text(items: list[Mapping[str, Any]], notes: dict[str, int]) -> str:
    if not items:
        return "-"
    parts = []
    passed = [r for r in items if r["status"] == "PASS"]
    if passed:
        worst = max(r["rel_err"] for r in passed)
        parts.append(f"PASS {len(passed)} ≤{worst:.1e}")
    for status in ("FAIL", "SKIP"):
        bad = [r for r in items if r["status"] == status]
        if bad:
            refs = sorted({notes.setdefault(_note(r), len(notes) + 1) for r in bad})
            parts.append(f"{status} {len(bad)} " + "".join(f"[{i}]" for i in refs))
    return ", ".join(parts)


def _note(r: Mapping[str, Any]) -> str:
    reason = r["reason"]
    if r["status"] == "FAIL":
        return f"FAIL {r['kernel']} {r['shape']}/{r['dtype']}: {reason}"
    return f"{r['kernel']}: {reason}"


def detail_table(results: Iterable[Any]) -> str:
    rows = [
        (
            r["format"], r["kernel"], r["shape"], r["dtype"], r["status"],
            "" if r["rel_err"] is None else f"{r['rel_err']:.2e}",
            "" if r["tol_rel"] is None else f"{r['tol_rel']:.1e}",
            r["reason"],
        )
        for r in _rows(results)
    ]
    return tabulate(rows, headers=("format", "kernel", "shape", "dtype", "result", "rel err", "tol", "reason"))


def counts(results: Iterable[Any]) -> dict[str, int]:
    out = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    for r in _rows(results):
        out[r["status"]] += 1
    return out


def to_json(results: Iterable[Any], *, device: str, meta: Mapping[str, Any] | None = None) -> str:
    rows = _rows(results)
    return json.dumps(
        {"device": device, **(meta or {}), "counts": counts(rows), "cells": rows}, indent=1
    )
