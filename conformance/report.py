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


def summary_table(
    results: Iterable[Any], *, group: str = "family", layout: str = "list", tablefmt: str = "simple"
) -> str:
    """The cells counted per format (or family) and kernel: PASS / FAIL / SKIP over shapes
    and dtypes, with the worst passing error; SKIP and FAIL reasons are listed once below
    as numbered notes. ``group="family"`` folds every parameter variant of a format into
    one row (``gptq4``, ``awq4``, …), ``"format"`` keeps each variant.

    ``layout="list"`` (the default) is one line per (format, kernel) pair that has cells,
    a few columns wide, so it fits a terminal; ``"matrix"`` is formats × kernels, one
    column per kernel (wide)."""
    if layout == "matrix":
        return _matrix(results, group=group, tablefmt=tablefmt)
    if layout != "list":
        raise ValueError(f"layout: expected 'list' or 'matrix', got {layout!r}")
    rows = _rows(results)
    key = family if group == "family" else (lambda slug: slug)
    cells: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        cells[(key(r["format"]), r["kernel"])].append(r)
    notes: dict[str, int] = {}
    table = []
    for (fmt, kernel), items in cells.items():
        by = {s: [r for r in items if r["status"] == s] for s in ("PASS", "FAIL", "SKIP")}
        worst = max((r["rel_err"] for r in by["PASS"]), default=None)
        refs = sorted({notes.setdefault(_note(r), len(notes) + 1) for r in by["FAIL"] + by["SKIP"]})
        table.append([fmt, kernel, len(by["PASS"]) or "", len(by["FAIL"]) or "", len(by["SKIP"]) or "",
                      "" if worst is None else f"{worst:.1e}", _refs(refs)])
    out = tabulate(table, headers=[group, "kernel", "PASS", "FAIL", "SKIP", "worst err", "FAIL/SKIP why"],
                   tablefmt=tablefmt, disable_numparse=[5])
    return out + _footer(rows, notes, tablefmt)


def _refs(refs: list[int]) -> str:
    """``[1][2][3][5]`` as ``[1-3,5]``: a kernel refused for many reasons stays one cell."""
    spans: list[list[int]] = []
    for i in refs:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return "[" + ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans) + "]" if spans else ""


def _footer(rows: list[Mapping[str, Any]], notes: dict[str, int], tablefmt: str) -> str:
    out = "\n\n" + "  ".join(f"{s} {n}" for s, n in counts(rows).items())
    bullet = "" if tablefmt == "simple" else "- "  # one note per line in Markdown too
    if notes:
        out += "\n" + ("\n" if bullet else "") + "\n".join(f"{bullet}[{i}] {reason}" for reason, i in notes.items())
    return out


def _matrix(results: Iterable[Any], *, group: str, tablefmt: str) -> str:
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
    return tabulate(table, headers=[group, *kernels], tablefmt=tablefmt) + _footer(rows, notes, tablefmt)


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
