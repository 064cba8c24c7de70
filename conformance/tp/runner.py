"""The tensor-parallel matrix: (case, kernel, dim, world) → PASS / FAIL / SKIP.

A cell cuts the case's golden stored tensors with the format's ``shard`` into ``world``
parts, prepares each part with the kernel (a kernel with ``shard_prepared`` prepares the
whole layer once and cuts its prepared state instead — the preprocessed TensorRT-LLM
layout is cut in place that way), calls it on each rank's slice of the input and puts
the outputs back together as the collectives would (:mod:`.ops`). The result must pass
the op's own judgement against the unsharded float64 golden output (the matrix's
tolerance, unchanged) and, for the same tolerance, equal the unsharded kernel's output.

SKIP is what a kernel refuses: its device, a shard shape (``supports`` on the shard's
problem), or the shard's tensors (``UnsupportedProblemError`` from ``prepare``: an
act-order GPTQ row shard for a kernel that needs even groups). Anything else is a FAIL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from quantcore.errors import UnsupportedProblemError
from quantcore.formats.sharding import Shard
from quantcore.ops.act_quant_lora import ActQuantLoraOutput
from quantcore.ops.harness import get_harness
from quantcore.probe import normalize_device, probe
from quantcore.problem import Problem
from quantcore.registry import KernelEntry, Registry, default_registry

from ..case import PROFILES, Case
from ..runner import FAIL, PASS, SKIP, CellResult, _err
from ..tolerance import compare, tolerance_for
from .cases import WORLDS, tp_cases
from .ops import RankCall, combine, rank_call, stored_tensors

__all__ = ["TPCell", "collect_tp_cells", "run_tp_cell"]


@dataclass(frozen=True)
class TPCell:
    case: Case
    kernel: KernelEntry
    dim: str
    world: int
    #: A named cut (``Format.shard_rules``), or None for the format's default.
    rule: str | None = None

    @property
    def id(self) -> str:
        rule = f"-{self.rule}" if self.rule else ""
        return f"{self.case.cell_id(self.kernel.cls.name)}/tp-{self.dim}{self.world}{rule}"


def collect_tp_cells(
    *,
    profile: str = "ci",
    formats: Sequence[str] = (),
    kernels: Sequence[str] = (),
    worlds: Sequence[int] = WORLDS,
    registry: Registry | None = None,
) -> list[TPCell]:
    """Every (case, kernel registered for its format and op, dim the format cuts, world)."""
    if profile not in PROFILES:
        raise ValueError(f"profile: expected one of {PROFILES}, got {profile!r}")
    reg = registry or default_registry()
    allowed = PROFILES[: PROFILES.index(profile) + 1]
    cells = []
    for case in tp_cases():
        if case.profile not in allowed:
            continue
        if formats and case.format.name not in formats and case.format.slug not in formats:
            continue
        for entry in reg.kernels(case.format.name, case.op):
            if kernels and entry.cls.name not in kernels and entry.plugin not in kernels:
                continue
            for dim in case.format.shard_dims:
                # the default cut, then every other named rule (the first rule is the default)
                for rule in (None, *case.format.shard_rules(dim)[1:]):
                    cells += [TPCell(case, entry, dim, w, rule) for w in worlds]
    cells.sort(key=lambda c: (c.case.weight_key, c.kernel.cls.name, c.case.id, c.dim, c.world, c.rule or ""))
    return cells


class _Recent:
    """The last few values by key (golden weights, the unsharded kernel's output), so
    cells that share them, which run next to each other, compute them once."""

    def __init__(self, size: int = 2) -> None:
        self._data: dict[Any, Any] = {}
        self._size = size

    def get(self, key: Any, make: Any) -> Any:
        if key not in self._data:
            if len(self._data) >= self._size:
                self._data.pop(next(iter(self._data)))
            self._data[key] = make()
        return self._data[key]


_weights = _Recent()
_unsharded = _Recent()


def _shard_problem(case: Case, shard: Shard) -> Problem:
    dims = dict(case.problem.dims)
    dims[shard.dim] = shard.size
    return Problem.of(shard.format, dims, case.act_dtype, op=case.op)


def _call(kernel: Any, prepared: Any, call: RankCall, dev: str) -> Any:
    x = call.x.to(dev)
    if call.topk_ids is None:
        return kernel(x, prepared)
    w = call.topk_weights.to(dev) if call.topk_weights is not None else None
    return kernel(x, call.topk_ids.to(dev), prepared, topk_weights=w)


def _prepare_ranks(cell: TPCell, shards: list[Shard], dev: str, tensors: dict[str, torch.Tensor]) -> list[Any]:
    cls, dtype = cell.kernel.cls, cell.case.act_dtype
    if hasattr(cls, "shard_prepared"):
        whole = cls(cell.case.format, torch.device(dev))
        prepared = whole.prepare({n: t.to(dev) for n, t in tensors.items()}, dtype=dtype)
        return [whole.shard_prepared(prepared, dim=s.dim, rank=s.rank, world=s.world) for s in shards]
    out = []
    for s in shards:
        kernel = cls(s.format, torch.device(dev))
        out.append(kernel.prepare({n: t.to(dev) for n, t in s.tensors.items()}, dtype=dtype))
    return out


def _versus_unsharded(combined: Any, unsharded: Any, dtype: torch.dtype) -> str:
    """"" when the sharded result equals the unsharded kernel's within the tolerance."""
    if isinstance(combined, ActQuantLoraOutput):
        for name, a, b in zip(("qout", "oscales"), combined[:2], unsharded[:2], strict=True):
            if not torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8)):
                return f"{name} differs from the unsharded kernel's"
        combined, unsharded, dtype = combined.lora_act_out, unsharded.lora_act_out, torch.float32
    verdict = compare(combined, unsharded.detach().to("cpu", torch.float64), tolerance_for(dtype))
    return "" if verdict.ok else f"vs the unsharded kernel: {verdict.problem}"


def run_tp_cell(cell: TPCell, device: str = "cpu") -> CellResult:
    case, cls = cell.case, cell.kernel.cls
    dev = normalize_device(device)
    base = dict(cell_id=cell.id, format=case.format.slug, kernel=cls.name, plugin=cell.kernel.plugin,
                shape=f"{case.shape_id}/{cell.id.rsplit('/', 1)[1]}", dtype=cell.case.id.rsplit("/", 1)[-1])
    try:
        reason = cls.check_device(probe(dev))
    except Exception as exc:
        reason = f"check raised {_err(exc)}"
    if reason:
        return CellResult(**base, status=SKIP, reason=reason)
    harness = get_harness(case.op)
    try:
        weights = _weights.get(case.weight_key, lambda: harness.weights(case))
        inputs = harness.inputs(case, weights)
        tensors = stored_tensors(case.op, weights)
        shards = [case.format.shard(tensors, dim=cell.dim, rank=r, world=cell.world, rule=cell.rule)
                  for r in range(cell.world)]
    except Exception as exc:  # the case promises cuts that work: a refusal here is a FAIL
        return CellResult(**base, status=FAIL, reason=f"golden side or shard raised {_err(exc)}")
    for s in shards:
        ok, why = cls.supports(_shard_problem(case, s))
        if not ok:
            return CellResult(**base, status=SKIP, reason=f"rank {s.rank} shard: {why}")
    try:
        prepared = _prepare_ranks(cell, shards, dev, tensors)
    except UnsupportedProblemError as exc:
        return CellResult(**base, status=SKIP, reason=f"prepare refused a shard: {exc}")
    except Exception as exc:
        return CellResult(**base, status=FAIL, reason=f"prepare raised {_err(exc)}")
    try:
        calls = [rank_call(case.op, s, inputs) for s in shards]
        outputs = [_call(cls(s.format, torch.device(dev)), p, c, dev) for s, p, c in zip(shards, prepared, calls, strict=True)]
        combined = combine(case.op, cell.dim, outputs, calls)
    except Exception as exc:
        return CellResult(**base, status=FAIL, reason=f"call raised {_err(exc)}")
    verdict = harness.judge(combined, case, inputs)
    problem, note = verdict.problem, ""
    if verdict.ok:
        try:
            unsharded = _unsharded.get((cls, case.id, dev), lambda: _run_unsharded(cls, case, weights, inputs, dev))
        except UnsupportedProblemError as exc:
            note = f"the unsharded kernel refuses the layer ({exc}): judged against the golden output only"
        else:
            problem = _versus_unsharded(combined, unsharded, case.act_dtype)
    return CellResult(
        **base, status=PASS if verdict.ok and not problem else FAIL, rel_err=verdict.rel_err,
        max_err=verdict.max_err, tol_rel=verdict.tolerance.rel, tol_max=verdict.tolerance.max,
        reason=problem or note,
    )


def _run_unsharded(cls: Any, case: Case, weights: Any, inputs: Any, dev: str) -> Any:
    ok, why = cls.supports(case.problem)
    if not ok:
        raise UnsupportedProblemError(why)
    harness = get_harness(case.op)
    kernel = cls(case.format, torch.device(dev))
    return harness.run(kernel, harness.prepare(kernel, case, weights), case, inputs)
