"""Running a suite: time every variant of a case together, then derive roofline shares
and speed-ups over each peer."""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import Any

import torch

from quantcore.cli.progress import Progress
from quantcore.timing import GRAPH_CALLS, time_interleaved

from .ceilings import Ceilings
from .spec import BenchCase

__all__ = ["run_cases"]


def run_cases(
    cases: Iterable[BenchCase],
    device: str,
    ceil: Ceilings,
    *,
    rounds: int = 7,
    graph: bool = False,
    graph_calls: int = GRAPH_CALLS,
    progress: bool = True,
    total: int | None = None,
) -> list[dict[str, Any]]:
    """Time every case's variants; ``total`` (the number of cases) gives the progress an ETA."""
    rows: list[dict[str, Any]] = []
    bar = Progress(total, "cases", enabled=progress)
    for case in cases:
        # Variants measured elsewhere (by the ranks of a multi-process suite) bring their timing.
        live = [v for v in case.variants if v.measured is None]
        timed = iter(time_interleaved([v.fn for v in live], device, rounds=rounds, graph=graph, graph_calls=graph_calls,
                                      sets=[v.sets for v in live]) if live else [])
        timings = [v.measured if v.measured is not None else next(timed) for v in case.variants]
        peer_times = {v.name: t.median_s for v, t in zip(case.variants, timings, strict=True) if v.role == "peer"}
        for v, t in zip(case.variants, timings, strict=True):
            rows.append({
                "suite": case.suite,
                "case": case.label,
                "dims": case.dims,
                "variant": v.name,
                "role": v.role,
                "time_s": t.median_s,
                "spread": t.spread,
                "bytes": v.bytes,
                "flops": v.flops,
                "bytes_per_s": v.bytes / t.median_s,
                "copy_share": v.bytes / t.median_s / ceil.copy_bytes_per_s,
                "matmul_share": v.flops / t.median_s / ceil.matmul_flops_per_s,
                "speedup_vs": {p: pt / t.median_s for p, pt in peer_times.items() if p != v.name},
                "note": "; ".join(n for n in (v.note, t.note) if n),
                **({"candidate": v.candidate, "keeps_dense": v.keeps_dense, "chosen": v.chosen} if v.candidate else {}),
            })
        for name, reason in case.skipped.items():
            rows.append({"suite": case.suite, "case": case.label, "dims": case.dims, "variant": name,
                         "role": "skipped", "note": reason})
        bar.step(f"{case.suite} {case.label}")
        del case, timings
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    bar.close()
    return rows
