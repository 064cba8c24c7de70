"""Measured kernel choice: ``get_kernel(..., tune=True)``.

Static priorities pick well on average; the fastest kernel for one device and shape can
differ. Tuning runs each usable candidate once on random weights of the problem's
shape, keeps only those whose output passes the conformance check against the golden
reference (the op's harness, :mod:`quantcore.ops.harness`) (a fast wrong kernel must never win), times them, and caches the winner on
disk keyed by device name, torch / triton / quantcore versions, format, op, dtype and
shape class (exact K and N; M rounded up to a power of two).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .dtypes import dtype_name
from .ops.case import Case
from .ops.harness import get_harness
from .probe import probe
from .problem import Problem
from .registry import Registry
from .timing import time_interleaved

__all__ = ["TuneResult", "cache_path", "shape_class", "tuned"]

_lock = threading.Lock()


def cache_path() -> Path:
    root = Path(os.environ.get("QUANTCORE_CACHE", Path.home() / ".cache" / "quantcore"))
    return root / "tuning.json"


@dataclass
class TuneResult:
    winner: str | None
    seconds: dict[str, float] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


def shape_class(problem: Problem) -> str:
    dims = dict(problem.dims)
    if "M" in dims:
        dims["M"] = 1 << max(0, (dims["M"] - 1).bit_length())
    return "-".join(f"{k}{v}" for k, v in sorted(dims.items()))


def _versions() -> str:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "-"

    return f"torch {torch.__version__}|triton {version('triton')}|quantcore {version('quantcore')}"


def _key(problem: Problem, device: str) -> str:
    return "|".join((
        probe(device).name or device, _versions(), problem.format.slug, problem.op,
        dtype_name(problem.act_dtype), shape_class(problem),
    ))


def _load() -> dict[str, Any]:
    path = cache_path()
    if path.exists():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            return {}
    return {}


def tuned(problem: Problem, device: str, candidates: list[str], registry: Registry) -> TuneResult:
    """The cached or freshly measured choice among ``candidates`` (usable kernel names)."""
    key = _key(problem, device)
    with _lock:
        hit = _load().get(key)
        if hit is not None and set(hit["candidates"]) == set(candidates):
            return TuneResult(hit["winner"], hit["seconds"], hit["refused"])
        result = _measure(problem, device, candidates, registry)
        cache = _load()
        cache[key] = {"candidates": candidates, "winner": result.winner,
                      "seconds": result.seconds, "refused": result.refused}
        cache_path().parent.mkdir(parents=True, exist_ok=True)
        cache_path().write_text(json.dumps(cache, indent=1))
        return result


def _measure(problem: Problem, device: str, candidates: list[str], registry: Registry) -> TuneResult:
    harness = get_harness(problem.op)
    case = Case(problem.format, problem.dims, problem.act_dtype, seed=0x7E57)
    weights = harness.weights(case)
    inputs = harness.inputs(case, weights)
    result = TuneResult(None)
    runners, names = [], []
    for name in candidates:
        cls = registry.kernel(problem.format.name, problem.op, name).cls
        kernel = cls(problem.format, torch.device(device))
        try:
            prepared = harness.prepare(kernel, case, weights)
            verdict = harness.judge(harness.run(kernel, prepared, case, inputs), case, inputs)
        except Exception as exc:
            result.refused[name] = f"raised {type(exc).__name__}: {exc}"
            continue
        if not verdict.ok:
            result.refused[name] = f"failed the conformance check: {verdict.problem}"
            continue
        runners.append(lambda i, k=kernel, p=prepared: harness.run(k, p, case, inputs))
        names.append(name)
    if runners:
        timings = time_interleaved(runners, device, rounds=5)
        result.seconds = {n: t.median_s for n, t in zip(names, timings, strict=True)}
        result.winner = min(result.seconds, key=result.seconds.__getitem__)
    return result
