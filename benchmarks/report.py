"""Benchmark results as a terminal table, JSON, a per-device markdown page and a plot."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

__all__ = ["device_slug", "markdown_page", "plot", "table", "write_json"]

RESULTS = Path(__file__).resolve().parent / "results"


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def _peers(rows: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["variant"] for r in rows if r["role"] == "peer"))


def table(rows: Sequence[dict[str, Any]], fmt: str = "simple") -> str:
    peers = _peers(rows)
    out = []
    for r in rows:
        if r["role"] == "skipped":
            out.append([r["case"], r["variant"], "skipped", "", "", "", "", *[""] * len(peers), r["note"]])
            continue
        out.append([
            r["case"], r["variant"] + (" ★" if r.get("chosen") else ""), r["role"],
            f"{r['time_s'] * 1e6:.1f}" + (f" ±{r['spread'] * 50:.0f}%" if r["spread"] > 0.1 else ""),
            f"{r['bytes_per_s'] / 1e9:.1f}" if r["bytes"] else "",
            f"{100 * r['copy_share']:.0f}%" if r["bytes"] else "",
            f"{100 * r['matmul_share']:.1f}%" if r["flops"] else "",
            *[f"{r['speedup_vs'][p]:.2f}×" if p in r["speedup_vs"] else "" for p in peers],
            r["note"],
        ])
    headers = ["case", "variant", "role", "µs", "GB/s", "of copy BW", "of matmul",
               *[f"vs {p}" for p in peers], "note"]
    return tabulate(out, headers=headers, tablefmt=fmt, disable_numparse=True)


def write_json(path: Path, rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "rows": list(rows)}, indent=1) + "\n")


def markdown_page(device_dir: Path) -> str:
    """The page ``results/<device>.md``, rebuilt from every suite's JSON for the device."""
    parts: list[str] = []
    for path in sorted(device_dir.glob("*.json")):
        data = json.loads(path.read_text())
        if "ceilings" not in data or "suite" not in data:
            continue  # not a suite's results (a probe's, say)
        if not parts:
            parts.append(f"# Benchmarks on {data['device_name']}\n")
            parts.append("Regenerated from the JSON beside this page by `quantcore bench`; do not edit.\n")
        c = data["ceilings"]
        parts.append(f"## {data['suite']}\n")
        parts.append(
            f"{data['date']}, torch {data['torch']}, {data.get('threads', '?')} threads. Ceilings measured in the "
            f"run: copy {c['copy_bytes_per_s'] / 1e9:.1f} GB/s (read + write), {c['matmul_what']} "
            f"{c['matmul_flops_per_s'] / 1e12:.2f} TFLOP/s. Timing: {data.get('timing', 'eager')}, median of "
            f"{data['rounds']} interleaved rounds; "
            "'vs X' is X's time over this row's (above 1 = faster than X)."
            + (" ★ marks the kernel `get_kernel` chooses by default for the case." if any(
                r.get("chosen") for r in data["rows"]) else "") + "\n"
        )
        parts.append(table(data["rows"], fmt="github") + "\n")
        for note in data.get("notes", []):
            parts.append(f"- {note}")
        parts.append("")
    return "\n".join(parts)


def plot(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Time against M (a MoE: T) for each variant, one panel per other dims; the default
    choice's points ringed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit(f"--plot needs matplotlib: pip install 'quantcore[bench]' ({exc})") from None
    batch = "M" if any("M" in r["dims"] for r in rows) else "T"  # a MoE's batch is its tokens
    timed = [r for r in rows if r["role"] != "skipped" and batch in r["dims"]]
    panels = sorted({tuple((k, v) for k, v in r["dims"].items() if k != batch) for r in timed})
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5 * max(1, len(panels)), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=False):
        mine = [r for r in timed if tuple((k, v) for k, v in r["dims"].items() if k != batch) == panel]
        for variant in dict.fromkeys(r["variant"] for r in mine):
            pts = sorted((r["dims"][batch], r["time_s"] * 1e6) for r in mine if r["variant"] == variant)
            ax.plot(*zip(*pts, strict=True), marker="o", label=variant)
            chosen = sorted((r["dims"][batch], r["time_s"] * 1e6) for r in mine if r["variant"] == variant
                            and r.get("chosen"))
            if chosen:  # the default choice: a ring around its points
                ax.plot(*zip(*chosen, strict=True), linestyle="none", marker="o", markersize=11,
                        markerfacecolor="none", markeredgecolor="black")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(batch)
        ax.set_ylabel("µs (median)")
        ax.set_title(" ".join(f"{k}={v}" for k, v in panel))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title + (" (ringed: get_kernel's default)" if any(r.get("chosen") for r in timed) else ""))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
