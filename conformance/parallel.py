"""Running many cells on the CPU in worker processes, as ``quantcore conformance -j N`` does.

The matrix on a CPU is mostly single-threaded Python (the Triton interpreter) and
memory-bound tensor code, so N processes of one thread each beat one process of N
threads: a torch thread pool mostly waits (spinning) on such work. Cells sharing golden
weights go to one worker as a group, so each golden quantization still runs once, and
the biggest groups go first so no worker is left with a long one at the end.

Each worker sets itself up for many small calls (:mod:`.worker`: one BLAS thread, large
tensors in huge pages) and drops a group's cached weights once the group has run. Workers are forked after the cells are collected (the registry, the cases and every
plugin are loaded once, in the parent) and before anything has run: nothing in the
parent has started a thread pool a child could inherit half-locked. Where fork is not
available, on an accelerator, or where this process has already initialised CUDA (a
driver's state must not be forked; the forked workers of a test process that had run
kernels on an H200 hung), cells run here, one after the other.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .runner import Cell, CellResult, forget_cached, run_cell
from .worker import set_up_worker

__all__ = ["default_jobs", "run_cells"]

_CELLS: Sequence[Cell] = ()  # what the forked workers run, inherited, never pickled
_DEVICE = "cpu"


def default_jobs() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _forkable(device: str) -> bool:
    """Whether cells on ``device`` may run in forked workers."""
    if device != "cpu" or "fork" not in multiprocessing.get_all_start_methods():
        return False
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


def _group_cost(cells: Sequence[Cell], indices: list[int]) -> float:
    """A rough cost, for ordering only: weight size, cells, and the Triton interpreter."""
    first = cells[indices[0]].case.problem
    weight = 1
    for dim in ("E", "K", "N", "R"):
        weight *= first.get(dim) or 1
    interpreted = sum("triton" in cells[i].kernel.cls.requires.packages for i in indices)
    return weight * len(indices) + 2e7 * interpreted


def _run_group(indices: list[int]) -> list[tuple[int, CellResult]]:
    results = [(i, run_cell(_CELLS[i], _DEVICE)) for i in indices]
    forget_cached()  # no other group shares this one's weights: their memory goes back now
    return results


def run_cells(
    cells: Sequence[Cell],
    device: str = "cpu",
    *,
    jobs: int = 1,
    done: Callable[[Cell, CellResult], Any] | None = None,
) -> list[CellResult]:
    """Every cell's result, in the order of ``cells``; ``done`` is called as each one
    finishes (in finishing order)."""
    results: list[CellResult | None] = [None] * len(cells)
    forkable = _forkable(device)
    if jobs > 1 and len(cells) > 1 and device == "cpu" and not forkable:
        print("quantcore conformance: this process cannot fork its workers safely (CUDA is initialised here, "
              "or fork is not available); running the cells in this process", file=sys.stderr)
    if jobs <= 1 or len(cells) < 2 or not forkable:
        for i, cell in enumerate(cells):
            results[i] = run_cell(cell, device)
            if done is not None:
                done(cell, results[i])  # type: ignore[arg-type]
        return results  # type: ignore[return-value]
    groups: dict[str, list[int]] = {}
    for i, cell in enumerate(cells):
        groups.setdefault(cell.case.weight_key, []).append(i)
    ordered = sorted(groups.values(), key=lambda g: _group_cost(cells, g), reverse=True)
    global _CELLS, _DEVICE
    _CELLS, _DEVICE = cells, device
    threads = max(1, default_jobs() // jobs)

    def finish(i: int, result: CellResult) -> None:
        results[i] = result
        if done is not None:
            done(cells[i], result)

    try:
        with ProcessPoolExecutor(jobs, multiprocessing.get_context("fork"), set_up_worker, (threads,)) as pool:
            futures = [pool.submit(_run_group, group) for group in ordered]
            for future in as_completed(futures):
                for i, result in future.result():
                    finish(i, result)
    except BrokenProcessPool:
        # A worker died (the kernel's OOM killer, a crash in native code): say so, and run
        # what is left here, one cell at a time, rather than wait forever or drop cells.
        left = [i for i in range(len(cells)) if results[i] is None]
        print(f"quantcore conformance: a worker process died; running the {len(left)} cells left in this process",
              file=sys.stderr)
        for i in left:
            finish(i, run_cell(cells[i], device))
    finally:
        _CELLS = ()
    return results  # type: ignore[return-value]
