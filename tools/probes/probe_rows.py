"""What the timing probes share: a call that rotates over weight sets, and the JSON file of
their rows beside the device's name and its measured copy bandwidth."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch

from quantcore.benchmarks.ceilings import ceilings

__all__ = ["rotating", "write_rows"]


def rotating(fns: list[Callable[[], Any]]) -> Callable[[int], Any]:
    """Call i runs ``fns[i mod len]``: one weight set after another, as ``time_interleaved`` replays."""
    return lambda i: fns[i % len(fns)]()


def write_rows(path: str, rows: list[dict[str, Any]]) -> None:
    """``rows`` as ``{"device", "copy_bytes_per_s", "rows"}`` at ``path`` (the current CUDA device)."""
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "copy_bytes_per_s": ceilings("cuda").copy_bytes_per_s,
                   "rows": rows}, f, indent=1)
