"""Speed-up over a peer against M, one panel per (K, N), from a suite's results JSON.

    python -m quantcore.benchmarks.speedup_plot RESULTS.json OUT.png [--peer dense_bf16] [--goals]

Every kernel row of the JSON is a line (its ``speedup_vs[peer]``); ``--goals`` draws
the ``triton_int4`` goals (``suites/gptq_linear.GOALS``) on the panels that carry them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["plot_speedup"]


def plot_speedup(data: dict[str, Any], path: Path, *, peer: str = "dense_bf16", goals: dict[int, float] | None = None,
                 goal_panels: tuple[tuple[int, int], ...] = ((4096, 14336), (14336, 4096))) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if r["role"] == "kernel" and peer in r.get("speedup_vs", {})]
    panels = sorted({(r["dims"]["K"], r["dims"]["N"]) for r in rows})
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5 * max(1, len(panels)), 4), squeeze=False)
    for ax, (k, n) in zip(axes[0], panels, strict=False):
        mine = [r for r in rows if (r["dims"]["K"], r["dims"]["N"]) == (k, n)]
        for variant in dict.fromkeys(r["variant"] for r in mine):
            pts = sorted((r["dims"]["M"], r["speedup_vs"][peer]) for r in mine if r["variant"] == variant)
            ax.plot(*zip(*pts, strict=True), marker="o", label=variant)
        if goals and (k, n) in goal_panels:
            ms = sorted(goals)
            ax.plot(ms, [goals[m] for m in ms], "k--", drawstyle="steps-mid", marker="_", markersize=14, label="goal")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("M")
        ax.set_ylabel(f"speed-up over {peer}")
        ax.set_title(f"K={k} N={n}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{data.get('suite', '')} on {data.get('device_name', '')} ({data.get('timing', '')})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--peer", default="dense_bf16")
    p.add_argument("--goals", action="store_true")
    args = p.parse_args(argv)
    goals = None
    if args.goals:
        from .suites.gptq_linear import GOALS as goals
    plot_speedup(json.loads(args.results.read_text()), args.out, peer=args.peer, goals=goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
