"""What the timing probes share: a call that rotates over weight sets, and the JSON file of
their rows beside the device's name and its measured copy bandwidth."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch

from quantcore.benchmarks.ceilings import ceilings

__all__ = ["record_times", "rotating", "write_rows"]


def rotating(fns: list[Callable[[], Any]]) -> Callable[[int], Any]:
    """Call i runs ``fns[i mod len]``: one weight set after another, as ``time_interleaved`` replays."""
    return lambda i: fns[i % len(fns)]()


def record_times(rows: list[dict[str, Any]], names: list[str], times: list[Any], where: dict[str, int],
                 base: int = 1) -> None:
    """Each name's timing (``time_interleaved``'s) into its row of ``rows`` — the row of
    that variant at ``where`` (e.g. ``{"k", "n", "m"}``), or a new one: µs, the ratio to
    call ``base``'s time (the dense peer), the spread and the method."""
    for name, t in zip(names, times, strict=True):
        row = next((r for r in rows if r["variant"] == name and all(r[a] == v for a, v in where.items())), None)
        if row is None:
            row = {**where, "variant": name}
            rows.append(row)
        row |= {"us": t.median_s * 1e6, "x_cublas": times[base].median_s / t.median_s, "spread": t.spread,
                "method": t.method}


def write_rows(path: str, rows: list[dict[str, Any]]) -> None:
    """``rows`` as ``{"device", "copy_bytes_per_s", "rows"}`` at ``path`` (the current CUDA device)."""
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "copy_bytes_per_s": ceilings("cuda").copy_bytes_per_s,
                   "rows": rows}, f, indent=1)
