"""Running cells: (case, kernel) → PASS / FAIL / SKIP, never silently absent."""

from __future__ import annotations

import copy
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from quantcore.ops.case import PROFILES, Case
from quantcore.ops.harness import get_harness
from quantcore.probe import normalize_device, probe
from quantcore.registry import KernelEntry, Registry, default_registry

from .untouched import written_inputs

__all__ = ["Cell", "CellResult", "collect_cells", "forget_cached", "run_cell", "run_matrix"]

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"


@dataclass(frozen=True)
class Cell:
    case: Case
    kernel: KernelEntry

    @property
    def id(self) -> str:
        return self.case.cell_id(self.kernel.cls.name)


@dataclass(frozen=True)
class CellResult:
    cell_id: str
    format: str
    kernel: str
    plugin: str
    shape: str
    dtype: str
    status: str
    rel_err: float | None = None
    max_err: float | None = None
    tol_rel: float | None = None
    tol_max: float | None = None
    reason: str = ""
    prepare_s: float | None = None
    run_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def summary(self) -> str:
        if self.status == PASS:
            return f"PASS rel {self.rel_err:.1e}"
        if self.status == FAIL:
            return f"FAIL {self.reason}"
        return f"SKIP {self.reason}"


def collect_cells(
    *,
    profile: str = "ci",
    formats: Sequence[str] = (),
    kernels: Sequence[str] = (),
    registry: Registry | None = None,
) -> list[Cell]:
    """Every (case, kernel) pair in ``profile``: each case × each kernel registered for its
    format and op. Filters match format names or slugs, and kernel or plugin names."""
    if profile not in PROFILES:
        raise ValueError(f"profile: expected one of {PROFILES}, got {profile!r}")
    reg = registry or default_registry()
    allowed = PROFILES[: PROFILES.index(profile) + 1]
    cells = []
    for case in reg.conformance_cases():
        if case.profile not in allowed:
            continue
        if formats and case.format.name not in formats and case.format.slug not in formats:
            continue
        for entry in reg.kernels(case.format.name, case.op):
            if kernels and entry.cls.name not in kernels and entry.plugin not in kernels:
                continue
            cells.append(Cell(case, entry))
    # Cells sharing weights run together so each golden quantization happens once.
    cells.sort(key=lambda c: (c.case.weight_key, c.kernel.cls.name))
    return cells


@dataclass(frozen=True)
class _Outcome:
    value: Any
    error: BaseException | None
    seconds: float


class _LRU:
    """A few recent results, failures included: cells that share weights (and, per
    kernel, the deterministic ``prepare``) reuse them, and a failure is reported by every
    cell that depends on it."""

    def __init__(self, size: int) -> None:
        self._data: OrderedDict[Any, _Outcome] = OrderedDict()
        self._size = size

    def clear(self) -> None:
        self._data.clear()

    def get(self, key: Any, make: Callable[[], Any]) -> _Outcome:
        if key in self._data:
            self._data.move_to_end(key)
            return self._data[key]
        t0 = time.perf_counter()
        try:
            value, error = make(), None
        except Exception as exc:
            value, error = None, exc
        outcome = _Outcome(value, error, time.perf_counter() - t0)
        self._data[key] = outcome
        while len(self._data) > self._size:
            self._data.popitem(last=False)
        return outcome

    def forget(self, key: Any) -> None:
        self._data.pop(key, None)


_weights = _LRU(size=2)
#: A copy of each cached weight's stored tensors, taken before any kernel saw them.
_stored = _LRU(size=2)
_prepared = _LRU(size=4)
#: A case's activations and golden output: the same for every kernel that runs the case.
_inputs = _LRU(size=64)


def forget_cached() -> None:
    """Drop every cached golden weight, input and prepared state: for a caller that has run
    all the cells sharing them (a worker at the end of a weight group), so their memory
    goes back before the next group."""
    for cache in (_weights, _prepared, _inputs):
        cache.clear()


def run_cell(cell: Cell, device: str = "cpu") -> CellResult:
    case, cls = cell.case, cell.kernel.cls
    dev = normalize_device(device)
    base = dict(
        cell_id=cell.id,
        format=case.format.slug,
        kernel=cls.name,
        plugin=cell.kernel.plugin,
        shape=case.shape_id,
        dtype=cell.id.rsplit("/", 1)[-1],
    )
    try:
        reason = _refusal(cls, dev, case)
    except Exception as exc:  # a kernel whose own checks raise is broken, not excused
        return CellResult(**base, status=FAIL, reason=f"check raised {_err(exc)}")
    if reason:
        return CellResult(**base, status=SKIP, reason=reason)
    harness = get_harness(case.op)
    golden = _weights.get(case.weight_key, lambda: harness.weights(case))
    try:
        if golden.error is not None:
            raise golden.error
        weights = golden.value
        drawn = _inputs.get((case.weight_key, case), lambda: harness.inputs(case, weights))
        if drawn.error is not None:
            raise drawn.error
        inputs = copy.deepcopy(drawn.value)  # each cell its own: a kernel that wrote into x would fail alone
        stored = _stored.get(case.weight_key, lambda: {n: t.clone() for n, t in harness.stored(weights).items()})
    except Exception as exc:  # the golden side itself failed: a FAIL of the case, loudly
        return CellResult(**base, status=FAIL, reason=f"golden reference raised {_err(exc)}")
    kernel = cls(case.format, torch.device(dev))
    key = (cls, case.weight_key, dev, case.act_dtype)
    prep = _prepared.get(key, lambda: harness.prepare(kernel, case, weights))
    if prep.error is not None:
        return CellResult(**base, status=FAIL, reason=f"prepare raised {_err(prep.error)}", prepare_s=prep.seconds)
    prep_s = prep.seconds
    try:
        t0 = time.perf_counter()
        output = harness.run(kernel, prep.value, case, inputs)
        _synchronize(dev)
        run_s = time.perf_counter() - t0
    except Exception as exc:
        return CellResult(**base, status=FAIL, reason=f"call raised {_err(exc)}", prepare_s=prep_s)
    written = written_inputs(drawn.value, inputs, harness.stored(weights), stored.value)
    if written:
        _weights.forget(case.weight_key)  # the cached weights are the ones written into
        _stored.forget(case.weight_key)
        return CellResult(**base, status=FAIL, reason=written, prepare_s=prep_s, run_s=run_s)
    verdict = harness.judge(output, case, inputs)
    return CellResult(
        **base,
        status=PASS if verdict.ok else FAIL,
        rel_err=verdict.rel_err,
        max_err=verdict.max_err,
        tol_rel=verdict.tolerance.rel,
        tol_max=verdict.tolerance.max,
        reason=verdict.problem,
        prepare_s=prep_s,
        run_s=run_s,
    )


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _refusal(cls: Any, device: str, case: Case) -> str:
    reason = cls.check_device(probe(device))
    if reason:
        return str(reason)
    ok, why = cls.supports(case.problem)
    return "" if ok else str(why)


def _err(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def run_matrix(cells: Iterable[Cell], device: str = "cpu") -> Iterator[CellResult]:
    for cell in cells:
        yield run_cell(cell, device)
