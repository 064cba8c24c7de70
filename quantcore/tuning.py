"""Measured kernel choice: ``get_kernel(..., tune=True)`` and ``quantcore tune``.

Declared costs pick well where they are right; the fastest kernel for one device and shape
can still differ. Tuning runs each usable candidate once on random weights of the
problem's shape, keeps only those whose output passes the conformance check against the
golden reference (the op's harness, :mod:`quantcore.ops.harness`; a fast wrong kernel
must never win), times them, and stores the times in this machine's cache
(:mod:`quantcore.measured`) per device name, format, op, dtype and shape class (exact K
and N; the batch dim rounded up to a power of two), with the torch / triton / quantcore
versions they were measured with. ``quantcore tune … --export`` writes them as a table
to ship inside the package.

Each candidate is timed on several prepared copies of the weight, together larger than
twice the last-level cache, called in turn, so the weight is read from memory as it is in
a model; with ``graph=True`` (CUDA) the calls are timed as CUDA-graph replays, as decode
runs in serving engines.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import measured
from .cost import batch_dim, shape_class
from .errors import InvalidArgumentError
from .ops import get_op
from .ops.case import Case
from .ops.harness import get_harness
from .probe import probe
from .problem import Problem
from .registry import Registry
from .timing import time_interleaved

__all__ = ["BYTES_PER_WEIGHT", "TuneResult", "cache_path", "check_fits", "memory_bytes", "shape_class", "tuned"]

_lock = threading.Lock()
#: Prepared copies per candidate, at most.
MAX_SETS = 8


def cache_path(device: str = "cpu") -> Path:
    """This machine's kernel-times cache for ``device``."""
    return measured.cache_file(probe(device).name or device)


@dataclass
class TuneResult:
    winner: str | None
    seconds: dict[str, float] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    timing: str = ""


def tuned(
    problem: Problem, device: str, candidates: list[str], registry: Registry, *, graph: bool = False,
    fresh: bool = False, weights: dict[str, Any] | None = None,
) -> TuneResult:
    """The cached or freshly measured times of ``candidates`` (usable kernel names); the
    winner is the fastest of all of them (selection applies the memory rule). ``fresh``
    measures even when the cache has them. ``weights``, a dict the caller keeps between
    calls, reuses the golden weights of the last (format, K, N) (``quantcore tune`` walks M
    within a shape; a one-off ``tune=True`` keeps nothing alive)."""
    name = probe(device).name or device
    with _lock:
        hit = None if fresh else measured.lookup_cached(problem, name)
        if hit is None or not hit.covers(candidates):
            check_fits(problem, device)
        if hit is not None and hit.covers(candidates) and (not graph or hit.timing == "cuda-graph"):
            seconds = {k: v for k, v in hit.seconds.items() if k in candidates}
            refused = {k: v for k, v in hit.refused.items() if k in candidates}
            return TuneResult(min(seconds, key=seconds.__getitem__) if seconds else None, seconds, refused, hit.timing)
        result = _measure(problem, device, candidates, registry, graph=graph, weights_cache=weights)
        measured.store(problem, name, measured.Measurement(
            result.seconds, result.refused, result.timing, measured.versions()))
        return result


#: Bytes the tuner holds per weight element at most: the float32 draw, the golden float64
#: dequantization and the stored and prepared copies.
BYTES_PER_WEIGHT = 24


def check_fits(problem: Problem, device: str) -> None:
    """Refuse, before anything is allocated, a problem whose weights the tuner could not
    hold in half this machine's memory (``K = N = 2^24`` would ask for exabytes)."""
    weight = 1
    for dim in get_op(problem.op).weight_dims:
        weight *= max(problem.get(dim) or 1, 1)
    need = weight * BYTES_PER_WEIGHT
    have = memory_bytes(device)
    if need > have // 2:
        dims = " × ".join(f"{d}={problem.get(d)}" for d in get_op(problem.op).weight_dims)
        raise InvalidArgumentError(
            f"problem: tuning a {dims} weight needs about {need / 2**30:.3g} GiB, more than half of the "
            f"{have / 2**30:.3g} GiB this {device} has"
        )


def memory_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 1 << 34


def _sets(weights: object, device: str) -> int:
    """Prepared copies enough to exceed twice the last-level cache (stored bytes as the
    measure of one copy: a kernel's own layout is about as large, or larger)."""
    per_set = _stored_bytes(weights)
    return max(1, min(MAX_SETS, -(-2 * _cache_bytes(device) // max(per_set, 1))))


def _stored_bytes(obj: object, depth: int = 0) -> int:
    """Bytes of the stored tensors a harness's weights hold (their ``tensors`` dicts)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if depth > 3:
        return 0
    if isinstance(obj, dict):
        return sum(_stored_bytes(v, depth + 1) for v in obj.values())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(_stored_bytes(getattr(obj, f.name), depth + 1) for f in dataclasses.fields(obj)
                   if not f.name.startswith(("_", "dense", "golden")))
    return 0


def _on_device(inputs: object, device: str) -> object:
    """The harness's inputs with the activations on ``device`` once, not copied per call
    (the golden output stays where the judge wants it)."""
    if not dataclasses.is_dataclass(inputs) or isinstance(inputs, type):
        return inputs
    moved = {f.name: getattr(inputs, f.name).to(device) for f in dataclasses.fields(inputs)
             if not f.name.startswith("golden") and isinstance(getattr(inputs, f.name), torch.Tensor)}
    return dataclasses.replace(inputs, **moved)


def _cache_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return int(getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 50 << 20))
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return max(sizes, default=32 << 20)


def _measure(
    problem: Problem, device: str, candidates: list[str], registry: Registry, *, graph: bool = False,
    weights_cache: dict[str, Any] | None = None,
) -> TuneResult:
    harness = get_harness(problem.op)
    batch = batch_dim(problem)
    case = Case(problem.format, problem.dims, problem.act_dtype, seed=0x7E57,
                weight_dims=tuple(d for d, _ in problem.dims if d != batch))
    if weights_cache is not None and case.weight_key in weights_cache:
        weights = weights_cache[case.weight_key]
    else:
        weights = harness.weights(case)
        if weights_cache is not None:
            weights_cache.clear()  # one shape's weights at a time: they can be gigabytes
            weights_cache[case.weight_key] = weights
    inputs = _on_device(harness.inputs(case, weights), device)
    sets = _sets(weights, device)
    result = TuneResult(None)
    runners, names = [], []
    for name in candidates:
        cls = registry.kernel(problem.format.name, problem.op, name).cls
        kernel = cls(problem.format, torch.device(device))
        try:
            prepared = [harness.prepare(kernel, case, weights) for _ in range(sets)]
            verdict = harness.judge(harness.run(kernel, prepared[0], case, inputs), case, inputs)
        except Exception as exc:
            result.refused[name] = f"raised {type(exc).__name__}: {exc}"
            continue
        if not verdict.ok:
            result.refused[name] = f"failed the conformance check: {verdict.problem}"
            continue
        runners.append(lambda i, k=kernel, p=prepared: harness.run(k, p[i % len(p)], case, inputs))
        names.append(name)
    if runners:
        use_graph = graph and device.startswith("cuda")
        timings = time_interleaved(runners, device, rounds=5, graph=use_graph, sets=[sets] * len(runners))
        result.seconds = {n: t.median_s for n, t in zip(names, timings, strict=True)}
        result.winner = min(result.seconds, key=result.seconds.__getitem__)
        methods = {t.method for t in timings}
        result.timing = methods.pop() if len(methods) == 1 else "mixed: " + ", ".join(sorted(methods))
    return result
