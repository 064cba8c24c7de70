"""The short table ``tp_linear_gpu.sh`` prints last: from the JSON it wrote under a results
folder, per kernel and module the host µs per call against ``nn.Linear`` (the ratio paired
by round where the run recorded one; and the
CUDA-graph replay µs), per tensor-parallel case the speed over the unsharded block and
the all-reduce's share (with the process group's all-reduce and with the one-shot one,
and which of them ``auto`` picks; in a host case, ``…-host``, the host's µs per eager
call and the block's parts), and whether each check passed or was skipped.

    python -m tools.probes.host_cost_table RESULTS_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from quantcore.benchmarks.suites.overhead import paired_ratio
from quantcore.benchmarks.suites.tp_linear import AUTO_PICKS

HOST_TARGET = 1.3


def _rows(folder: Path, suite: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(folder.rglob(f"{suite}.json")):
        rows += json.loads(path.read_text()).get("rows", [])
    return rows


def overhead_lines(rows: list[dict[str, Any]]) -> list[str]:
    by_case: dict[str, dict[str, float]] = {}
    paired: dict[tuple[str, str], float | None] = {}
    for r in rows:
        if r["role"] != "skipped" and r["case"].startswith(("host-", "graph-")):
            by_case.setdefault(r["case"], {})[r["variant"]] = r["time_s"]
            paired[r["case"], r["variant"]] = paired_ratio(r)
    lines = []
    for case, times in by_case.items():
        base = times.get("nn.Linear")
        if not base:
            continue
        graph = case.startswith("graph-")
        cells = []
        for name, t in times.items():
            if name == "nn.Linear":
                continue
            ratio = paired[case, name] or t / base  # paired by round where the run recorded it
            flag = "" if graph or name == "F.linear" or ratio <= HOST_TARGET else " !"
            cells.append(f"{name} {t * 1e6:.1f} ({ratio:.2f}×){flag}")
        lines.append(f"{case:34s} nn.Linear {base * 1e6:6.1f} µs | " + " | ".join(cells))
    return lines


def tp_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = {r["variant"]: r["time_s"] for r in rows if r["case"] == case and r["role"] != "skipped"}
        tp = next((t for n, t in mine.items() if n.startswith("tp") and n.endswith("_mlp")), None)
        if tp is None or "unsharded_mlp" not in mine:
            continue
        share = f"{100 * mine['all_reduce'] / tp:.0f}%" if "all_reduce" in mine else "—"
        line = (f"{case:30s} tp {tp * 1e6:8.1f} µs  unsharded {mine['unsharded_mlp'] * 1e6:8.1f} µs  "
                f"speed-up {mine['unsharded_mlp'] / tp:.2f}×  all-reduce {share}")
        one = next((t for n, t in mine.items() if n.startswith("tp") and n.endswith("_mlp_one_shot")), None)
        if one is not None:
            one_share = f"{100 * mine['all_reduce_one_shot'] / one:.0f}%" if "all_reduce_one_shot" in mine else "—"
            line += f" | one-shot: tp {one * 1e6:8.1f} µs  speed-up {mine['unsharded_mlp'] / one:.2f}×  all-reduce {one_share}"
        graphed = next((t for n, t in mine.items() if n.startswith("tp") and n.endswith("_mlp_graphed")), None)
        if graphed is not None:
            whole = mine.get("unsharded_mlp_graphed")
            line += (f" | graphed: tp {graphed * 1e6:8.1f} µs  speed-up {mine['unsharded_mlp'] / graphed:.2f}×"
                     + (f"  unsharded {whole * 1e6:8.1f} µs ({whole / graphed:.2f}×)" if whole else ""))
        graphed_one = next((t for n, t in mine.items() if n.startswith("tp") and n.endswith("_mlp_graphed_one_shot")), None)
        if graphed_one is not None:
            line += f" | graphed one-shot: tp {graphed_one * 1e6:8.1f} µs  speed-up {mine['unsharded_mlp'] / graphed_one:.2f}×"
        apart = next((t for n, t in mine.items() if n.startswith("tp") and n.endswith("_mlp_unfused")), None)
        if apart is not None:
            line += f" | gate/up apart: tp {apart * 1e6:8.1f} µs  fused {apart / tp:.2f}×"
        gate_up, hidden, down = (next((t for n, t in mine.items() if n.startswith("tp") and n.endswith(f"_{part}")), None)
                                 for part in ("gate_up", "hidden", "down"))
        if gate_up is not None and hidden is not None and down is not None:
            line += (f" | parts: gate/up {gate_up * 1e6:.1f}  act {(hidden - gate_up) * 1e6:.1f}  "
                     f"down {down * 1e6:.1f} µs")
        auto = next((r["variant"] for r in rows if r["case"] == case and AUTO_PICKS in r.get("note", "")), None)
        lines.append(line + (f" | auto: {'one-shot' if auto.endswith('_one_shot') else 'backend'}" if auto else ""))
    return lines


def _fusion(report: dict[str, Any]) -> str:
    """How a check's ranks ran gate and up: one launch, or two and why."""
    why = {w for w in report.get("unfused_why", []) if w}
    return "?" if "unfused_why" not in report else f"apart ({'; '.join(sorted(why))})" if why else "fused"


def check_lines(folder: Path) -> list[str]:
    lines = []
    for path in sorted(folder.glob("tp_check*.json")):
        try:
            report = json.loads(path.read_text().strip().splitlines()[-1])
        except (ValueError, IndexError):
            lines.append(f"{path.stem}: no report")
            continue
        verdict = "PASS" if report.get("ok") else f"SKIP ({report['skipped']})" if report.get("skipped") else "FAIL"
        lines.append(f"{path.stem}: {verdict} ({report.get('format', '?')}, world {report.get('world')}, {report.get('backend')} on "
                     f"{report.get('device')}, all-reduce {report.get('all_reduce_path', 'backend')} "
                     f"{report.get('all_reduce', '')}, kernels {report.get('kernels', '?')}, "
                     f"gate/up {_fusion(report)})")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0] if args else ".")
    sections = [
        ("host µs per call (eager) and CUDA-graph replay µs; ! = over 1.3× nn.Linear", overhead_lines(_rows(folder, "overhead"))),
        ("tensor-parallel GPTQ-4 MLP block", tp_lines(_rows(folder, "tp_linear"))),
        ("checks", check_lines(folder)),
    ]
    for title, lines in sections:
        print(f"--- {title}")
        print("\n".join(lines) if lines else "(none)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
