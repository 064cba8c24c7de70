"""Choosing a kernel: rank every candidate, keep the reason for every refusal.

How the candidates that can run are ordered (the first is chosen):

1. ``prefer=`` (or ``QUANTCORE_PREFER``) names, in their order.
2. Memory: a kernel that keeps a dense copy of the weight (``Kernel.keeps_dense_weight``,
   e.g. ``torch_fallback``) comes after every kernel that keeps it compressed, unless the
   caller allows dense copies (``allow_dense=True`` or ``QUANTCORE_ALLOW_DENSE=1``), names it
   in ``prefer``, or nothing compressed can run. A kernel with a negative priority on the
   device (Triton's interpreter on a CPU: a correctness tool, run when asked for by name)
   does not count as something compressed that can run.
3. Time for the shape. A measured entry for this device and shape class that covers every
   candidate (this machine's cache, then the tables shipped in the package;
   :mod:`quantcore.measured`) ranks by measured time. Otherwise the kernels that declare a
   cost (:meth:`Kernel.cost`, :mod:`quantcore.cost`) rank by their estimates and stand
   together at the highest priority among them, so that a kernel declaring none still ranks
   by its priority against them. A problem without its batch dim (M unknown, as for a module
   built before it sees an input) ranks by the worst slowdown against the fastest over
   M = 1 … 4096, so one kernel that is 25× off at prefill never wins for a 10 % gain at decode.
4. Priority (``Kernel.priority_on``), then name.

``explain`` only reads: it ranks and says why, and changes nothing. ``get_kernel`` (and
``bind``) act on the ranking: they cache the choice, log it once per format, device and
shape class (INFO, logger ``quantcore``), and record a kernel whose own checks raise as
failed on that device (:mod:`quantcore.selection_state`).

Environment variables (comma-separated kernel or plugin names, except the last):

``QUANTCORE_DISABLE``      never choose these.
``QUANTCORE_FORCE``        choose only this one; if it cannot run, fail and say why.
``QUANTCORE_PREFER``       try these first, in this order (``prefer=`` overrides it).
``QUANTCORE_ALLOW_DENSE``  ``1``: dense copies compete on time like the others.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from tabulate import tabulate

from . import measured
from .cost import BATCH_SIZES, Cost, DeviceRates, batch_dim, device_rates, shape_class, with_batch
from .errors import InvalidArgumentError, NoKernelError, PluginError, UnknownFormatError
from .formats.base import Format
from .kernel import Kernel
from .probe import Capabilities, normalize_device, probe
from .problem import Problem
from .registry import Registry, default_registry
from .selection_state import FailureKey, SelectionState, selection_state

__all__ = [
    "ENV_ALLOW_DENSE",
    "ENV_DISABLE",
    "ENV_FORCE",
    "ENV_PREFER",
    "Candidate",
    "Explanation",
    "explain",
    "get_kernel",
    "log_choice",
    "rank",
]

log = logging.getLogger(__name__)

ENV_DISABLE = "QUANTCORE_DISABLE"
ENV_FORCE = "QUANTCORE_FORCE"
ENV_PREFER = "QUANTCORE_PREFER"
ENV_ALLOW_DENSE = "QUANTCORE_ALLOW_DENSE"

SELECTED, USABLE, REFUSED, DISABLED, BROKEN = "selected", "usable", "refused", "disabled", "broken"
DENSE_HELD_BACK = ("keeps a dense copy of the weight: chosen only when nothing that keeps it compressed "
                   "can run, or with allow_dense=True")


@dataclass(frozen=True)
class Candidate:
    kernel: str
    plugin: str
    priority: int
    status: str
    reason: str = ""
    #: Median seconds per call, measured (``tune=True``, or a cached or shipped table).
    measured_s: float | None = None
    #: Seconds per call estimated from the kernel's declared cost.
    estimated_s: float | None = None
    #: The kernel keeps a dense copy of the weight (``Kernel.keeps_dense_weight``).
    keeps_dense: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "kernel": self.kernel,
            "plugin": self.plugin,
            "priority": self.priority,
            "status": self.status,
            "reason": self.reason,
            "measured_s": self.measured_s,
            "estimated_s": self.estimated_s,
            "keeps_dense": self.keeps_dense,
        }


@dataclass(frozen=True)
class Explanation:
    """Every candidate for a request, chosen or refused, and why. ``str()`` is the table."""

    format: str
    device: str
    problem: str
    candidates: tuple[Candidate, ...] = field(default=())
    #: What ordered the usable candidates: measured times, declared costs or priorities.
    basis: str = ""
    #: The kernel chosen at each batch size (``explain`` sweeps them; empty otherwise):
    #: how the shape moves the choice.
    by_batch: tuple[tuple[int, str | None], ...] = ()
    batch_dim: str = "M"

    @property
    def selected(self) -> Candidate | None:
        for c in self.candidates:
            if c.status == SELECTED:
                return c
        return None

    def as_dict(self) -> dict[str, object]:
        return {
            "format": self.format,
            "device": self.device,
            "problem": self.problem,
            "selected": self.selected.kernel if self.selected else None,
            "basis": self.basis,
            "by_batch": [{"batch": b, "selected": k} for b, k in self.by_batch],
            "candidates": [c.as_dict() for c in self.candidates],
        }

    def table(self) -> str:
        head = f"{self.format} on {self.device}" + (f" for {self.problem}" if self.problem else "")
        if not self.candidates:
            return f"{head}: no kernel is registered for this format"
        estimated = any(c.estimated_s is not None for c in self.candidates)
        timed = any(c.measured_s is not None for c in self.candidates)
        dense = any(c.keeps_dense and c.status in (SELECTED, USABLE) for c in self.candidates)
        headers = ["kernel", "plugin", "priority", "status", *(["est. µs"] if estimated else []),
                   *(["measured µs"] if timed else []), *(["weight"] if dense else []), "reason"]
        rows = [
            [c.kernel, c.plugin, c.priority, c.status,
             *([_us(c.estimated_s)] if estimated else []), *([_us(c.measured_s)] if timed else []),
             *([("dense copy" if c.keeps_dense else "compressed") if c.status in (SELECTED, USABLE) else ""]
               if dense else []),
             c.reason]
            for c in self.candidates
        ]
        lines = [head, tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)]
        if self.basis:
            lines.append(f"ranked by {self.basis}")
        if self.by_batch:
            lines.append(f"chosen by {self.batch_dim} (other dims as given): " + _ranges(self.by_batch, self.batch_dim))
        return "\n".join(lines)

    __str__ = table


def _us(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return "inf" if math.isinf(seconds) else f"{seconds * 1e6:.1f}"


def _ranges(by_batch: Sequence[tuple[int, str | None]], dim: str) -> str:
    """``M=1–4 aten_cuda · M=8–4096 triton_int4``."""
    runs: list[tuple[int, int, str | None]] = []
    for b, k in by_batch:
        if runs and runs[-1][2] == k:
            runs[-1] = (runs[-1][0], b, k)
        else:
            runs.append((b, b, k))
    return " · ".join(f"{dim}={lo}" + (f"–{hi}" if hi != lo else "") + f" {k or 'none'}" for lo, hi, k in runs)


def _env_names(var: str) -> tuple[str, ...]:
    raw = os.environ.get(var, "")
    return tuple(n.strip() for n in raw.split(",") if n.strip())


def _resolve(
    format: str | Format, problem: Problem | None, registry: Registry
) -> Format:
    if problem is not None:
        if isinstance(format, Format) and format != problem.format:
            raise InvalidArgumentError(f"format: {format.slug} disagrees with problem.format {problem.format.slug}")
        if isinstance(format, str) and format != problem.format.name:
            raise UnknownFormatError(
                f"format: {format!r} disagrees with problem.format {problem.format.name!r}"
            )
        return problem.format
    if isinstance(format, Format):
        return format
    return registry.format_class(format)()


def _match(entry_names: tuple[str, str], names: Sequence[str]) -> bool:
    return entry_names[0] in names or entry_names[1] in names


def _allow_dense(allow_dense: bool | None) -> bool:
    if allow_dense is not None:
        return allow_dense
    return os.environ.get(ENV_ALLOW_DENSE, "").strip().lower() in ("1", "true", "yes")


def explain(
    format: str | Format,
    device: str | torch.device = "cpu",
    *,
    problem: Problem | None = None,
    prefer: str | Sequence[str] | None = None,
    tune: bool = False,
    allow_dense: bool | None = None,
    registry: Registry | None = None,
) -> Explanation:
    """Rank every kernel registered for ``format`` on ``device``, as data; records nothing
    (a kernel whose checks raise is shown refused with the error, and ``get_kernel`` or
    ``bind`` will record it). With a problem, the table also shows the kernel chosen at
    every batch size (how the shape moves the choice). With ``tune=True`` the usable
    candidates are checked and timed (see :mod:`quantcore.tuning`) and the table shows
    what was measured."""
    reg = registry or default_registry()
    fmt = _resolve(format, problem, reg)
    dev, prefs, dense_ok = normalize_device(device), _prefer_tuple(prefer), _allow_dense(allow_dense)
    expl, _ = _explain(fmt, dev, problem, prefs, reg, dense_ok)
    if problem is not None:
        sweep = tuple((b, _explain(fmt, dev, with_batch(problem, b), prefs, reg, dense_ok)[0].selected)
                      for b in BATCH_SIZES)
        expl = Explanation(expl.format, expl.device, expl.problem, expl.candidates, expl.basis,
                           tuple((b, c.kernel if c else None) for b, c in sweep), batch_dim(problem))
    return _tuned(expl, problem, reg, dense_ok) if tune else expl


def rank(
    fmt: Format,
    device: str,
    *,
    problem: Problem | None,
    prefer: str | Sequence[str] | None,
    registry: Registry,
    allow_dense: bool | None = None,
) -> Explanation:
    """``explain`` for those about to act on the answer (``get_kernel``, ``bind``): a kernel
    whose own checks raised is recorded as failed on ``device``, refused from then on."""
    expl, broke = _explain(fmt, device, problem, _prefer_tuple(prefer), registry, _allow_dense(allow_dense))
    state = selection_state(registry)
    for key, reason in broke.items():
        state.record_failure(*key, reason)
    return expl


def log_choice(registry: Registry, fmt: Format, device: str, problem: Problem | None, kernel: str,
               reason: str, *, how: str = "chose") -> None:
    """INFO on the ``quantcore`` logger, once per (format, device, shape class) and registry."""
    shape = shape_class(problem) if problem is not None else "any shape"
    if selection_state(registry).first_time(("choice", fmt.slug, device, shape, kernel)):
        log.info("%s %s for %s on %s, %s: %s", how, kernel, fmt.slug, device, shape, reason)


def _tuned(expl: Explanation, problem: Problem | None, reg: Registry, allow_dense: bool) -> Explanation:
    """Re-rank the usable candidates of ``expl`` by measured time (the memory rule still
    holds: a dense copy is chosen only when allowed or when nothing compressed runs)."""
    if problem is None:
        raise InvalidArgumentError("problem: tune=True needs a problem, the measurement is per shape")
    from .tuning import tuned

    usable = [c for c in expl.candidates if c.status in (SELECTED, USABLE)]
    if len(usable) < 2:
        return expl
    result = tuned(problem, expl.device, [c.kernel for c in usable], reg)
    fine = [c for c in usable if c.kernel not in result.refused]
    compressed = any(not c.keeps_dense and c.priority >= 0 for c in fine)

    def held_back(c: Candidate) -> bool:
        return c.keeps_dense and compressed and not allow_dense

    ranked: list[Candidate] = []
    order = sorted(fine, key=lambda c: (held_back(c), result.seconds.get(c.kernel, math.inf)))
    for i, c in enumerate(order):
        t = result.seconds.get(c.kernel)
        if i == 0:
            why = "fastest measured" + ("" if not c.keeps_dense or not compressed else "; allow_dense: dense copies allowed")
            if c.keeps_dense and not compressed:
                why += "; keeps a dense copy of the weight: nothing that keeps it compressed can run"
            ranked.append(Candidate(c.kernel, c.plugin, c.priority, SELECTED, why, t, c.estimated_s, c.keeps_dense))
        else:
            ranked.append(Candidate(c.kernel, c.plugin, c.priority, USABLE, DENSE_HELD_BACK if held_back(c) else "",
                                    t, c.estimated_s, c.keeps_dense))
    ranked += [Candidate(c.kernel, c.plugin, c.priority, REFUSED, f"tuning: {result.refused[c.kernel]}", None,
                         c.estimated_s, c.keeps_dense) for c in usable if c.kernel in result.refused]
    rest = [c for c in expl.candidates if c.status not in (SELECTED, USABLE)]
    basis = f"times measured on this device ({result.timing or 'cached'})"
    return Explanation(expl.format, expl.device, expl.problem, tuple(ranked + rest), basis, expl.by_batch,
                       expl.batch_dim)


def _prefer_tuple(prefer: str | Sequence[str] | None) -> tuple[str, ...]:
    if prefer is None:
        return _env_names(ENV_PREFER)
    if isinstance(prefer, str):
        return (prefer,)
    return tuple(prefer)


@dataclass
class _Usable:
    cls: type[Kernel]
    names: tuple[str, str]
    priority: int
    prefer_rank: int
    note: str
    #: Seconds per call by batch size (one entry, the problem's own, when it has one).
    estimated: dict[int, float] = field(default_factory=dict)
    bound: str = ""
    #: What ranks it (seconds, or the worst slowdown without a batch size); None: priority.
    time: float | None = None
    measured_s: float | None = None
    held_back: bool = False
    detail: str = ""
    #: The problem's batch dim (``M``; ``T`` for a MoE).
    dim: str = "M"


def _explain(
    fmt: Format, device: str, problem: Problem | None, prefer: tuple[str, ...], reg: Registry,
    allow_dense: bool = False,
) -> tuple[Explanation, dict[FailureKey, str]]:
    """The ranking, and the kernels whose checks raised just now (for the caller to record)."""
    caps = probe(device)
    rates = device_rates(caps)
    state: SelectionState = selection_state(reg)
    broken_now: dict[FailureKey, str] = {}
    disabled, forced = _env_names(ENV_DISABLE), _env_names(ENV_FORCE)
    op = problem.op if problem is not None else fmt.op
    sizes = _batch_sizes(problem)
    usable: list[_Usable] = []
    others: list[Candidate] = []
    for entry in reg.kernels(fmt.name, op):
        cls, names = entry.cls, (entry.cls.name, entry.plugin)
        priority, broke = _priority(cls, caps)
        dense = bool(getattr(cls, "keeps_dense_weight", False))
        if _match(names, disabled):
            others.append(Candidate(*names, priority, DISABLED, f"{ENV_DISABLE}={','.join(disabled)}", keeps_dense=dense))
            continue
        if forced and not _match(names, forced):
            others.append(Candidate(*names, priority, REFUSED, f"{ENV_FORCE}={','.join(forced)}", keeps_dense=dense))
            continue
        failed = state.failure(fmt.name, op, cls.name, device)
        reason, bound = "", ""
        estimated: dict[int, float] = {}
        if not failed:
            reason, raised = _refusal(cls, caps, problem)
            broke = broke or raised
            if not reason and not broke and problem is not None and sizes:
                estimated, bound, broke = _estimates(cls, caps, rates, problem, sizes)
            if broke:
                # A kernel whose own checks raise is buggy: refused here, and (once someone
                # acts on this ranking) from now on on this device, like one that fails in
                # prepare or in a call.
                broken_now[(fmt.name, op, cls.name, device)] = broke
                failed = broke
        if failed:
            reason = f"failed at run time: {failed}"
        if reason:
            others.append(Candidate(*names, priority, REFUSED, reason, keeps_dense=dense))
            continue
        note = "" if problem is not None else "no problem given: shape and dtype limits unchecked"
        rank_prefer = next((i for i, n in enumerate(prefer) if n in names), len(prefer))
        usable.append(_Usable(cls, names, priority, rank_prefer, note, estimated, bound,
                              dim=batch_dim(problem) if problem is not None else "M"))
    basis = _order(usable, caps, rates, problem, sizes, len(prefer), allow_dense, reg) if usable else ""
    ranked = [_candidate(u, i == 0, prefer, usable) for i, u in enumerate(usable)]
    broken = [Candidate("-", b.plugin, 0, BROKEN, f"{b.stage}: {b.error}") for b in reg.broken()]
    explanation = Explanation(
        format=fmt.slug,
        device=device,
        problem=problem.describe() if problem is not None else "",
        candidates=tuple(ranked + others + broken),
        basis=basis,
        batch_dim=batch_dim(problem) if problem is not None else "M",
    )
    return explanation, broken_now


def _batch_sizes(problem: Problem | None) -> tuple[int, ...]:
    """The batch sizes a problem is judged at: its own, or all of BATCH_SIZES without one."""
    if problem is None:
        return ()
    own = problem.get(batch_dim(problem))
    return (own,) if own is not None else BATCH_SIZES


def _estimates(cls: type[Kernel], caps: Capabilities, rates: DeviceRates, problem: Problem,
               sizes: tuple[int, ...]) -> tuple[dict[int, float], str, str]:
    """``(seconds by batch size, what bounds the first, what cost raised or "")``. A kernel
    declaring no cost, or whose cost needs a dim the problem lacks, has no estimates."""
    out: dict[int, float] = {}
    bound = ""
    if any(v < 0 for _, v in problem.dims):
        return {}, "", ""  # a malformed problem is the caller's, not a reason to blame a kernel
    for b in sizes:
        p = problem if problem.get(batch_dim(problem)) == b else with_batch(problem, b)
        try:
            cost = cls.cost(caps, p)
        except KeyError:
            return {}, "", ""
        except Exception as exc:
            return {}, "", f"cost raised {type(exc).__name__}: {exc}"
        if cost is None:
            return {}, "", ""
        if not isinstance(cost, Cost):
            return {}, "", f"cost returned {type(cost).__name__}, not a quantcore.cost.Cost"
        out[b] = cost.seconds(rates)
        bound = bound or cost.bound(rates) + "-bound" + (f", {cost.note}" if cost.note else "")
    return out, bound, ""


def _order(usable: list[_Usable], caps: Capabilities, rates: DeviceRates, problem: Problem | None,
           sizes: tuple[int, ...], n_prefer: int, allow_dense: bool, reg: Registry) -> str:
    """Sort ``usable`` in place (the first is chosen) and return what ranked it."""
    compressed = any(not u.cls.keeps_dense_weight and u.priority >= 0 for u in usable)
    for u in usable:
        u.held_back = u.cls.keeps_dense_weight and compressed and not allow_dense and u.prefer_rank == n_prefer
    basis = "priority (no kernel declares a cost)"
    if problem is not None and sizes:
        times, basis = _times(usable, caps, rates, problem, sizes, reg)
        if len(sizes) == 1:
            for u in usable:
                u.time = times[sizes[0]].get(u.names[0])
        else:
            _worst_slowdowns(usable, times, sizes)
    timed = [u.priority for u in usable if u.time is not None]
    block = max(timed) if timed else 0

    def key(u: _Usable) -> tuple[object, ...]:
        if u.time is not None:
            return (u.prefer_rank, u.held_back, -block, 0, u.time, -u.priority, u.names[0])
        return (u.prefer_rank, u.held_back, -u.priority, 1, 0.0, -u.priority, u.names[0])

    usable.sort(key=key)
    return basis


def _times(usable: list[_Usable], caps: Capabilities, rates: DeviceRates, problem: Problem,
           sizes: tuple[int, ...], reg: Registry) -> tuple[dict[int, dict[str, float]], str]:
    """Seconds per kernel per batch size: measured where an entry covers every candidate,
    else the declared estimates; and what they rest on."""
    names = [u.names[0] for u in usable]
    known = _known(reg, problem)
    times: dict[int, dict[str, float]] = {}
    sources: set[str] = set()
    for b in sizes:
        p = problem if problem.get(batch_dim(problem)) == b else with_batch(problem, b)
        m = measured.lookup(p, caps.name, known=known)
        if m is not None and m.covers(names):
            times[b] = {n: m.seconds.get(n, math.inf) for n in names}
            sources.add(f"{m.source}" + (f", {m.timing}" if m.timing else ""))
            if len(sizes) == 1:
                for u in usable:
                    u.measured_s = m.seconds.get(u.names[0])
                    u.detail = f"refused by the tuner: {m.refused[u.names[0]]}" if u.names[0] in m.refused else ""
        else:
            times[b] = {u.names[0]: u.estimated[b] for u in usable if b in u.estimated}
    estimated = len(sources) < len(sizes) and any(u.estimated for u in usable)
    parts = ([f"measured times ({'; '.join(sorted(sources))})"] if sources else []) + (
        [f"declared costs (device rates {rates.source})"] if estimated else [])
    if not parts:
        return times, "priority (no kernel declares a cost)"
    return times, " and ".join(parts)


def _known(reg: Registry, problem: Problem) -> Callable[[str], bool]:
    names = {e.cls.name for e in reg.kernels(problem.format.name, problem.op)}
    return names.__contains__


def _worst_slowdowns(usable: list[_Usable], times: dict[int, dict[str, float]], sizes: tuple[int, ...]) -> None:
    """Without a batch size: each kernel's worst ratio to the fastest of its memory class,
    over every batch size (``time`` = that ratio, ``detail`` says where)."""
    for u in usable:
        name = u.names[0]
        if not all(name in times[b] for b in sizes):
            continue
        worst, where = 0.0, sizes[0]
        for b in sizes:
            peers = [times[b][v.names[0]] for v in usable if v.held_back == u.held_back and v.names[0] in times[b]]
            ratio = times[b][name] / min(peers) if min(peers) > 0 else 1.0
            if ratio > worst:
                worst, where = ratio, b
        u.time = worst
        u.detail = f"worst {worst:.2f}× the fastest, at {u.dim}={where}"


def _candidate(u: _Usable, first: bool, prefer: tuple[str, ...], usable: list[_Usable]) -> Candidate:
    name = u.names[0]
    one_size = len(u.estimated) <= 1
    estimate = next(iter(u.estimated.values())) if u.estimated and one_size else None
    dense = bool(u.cls.keeps_dense_weight)
    if first:
        if prefer and name in prefer:
            why = "preferred"
        elif u.time is None:
            why = "highest priority" + (" (declares no cost)" if any(v.time is not None for v in usable) else "")
        elif not one_size:
            why = f"no {u.dim} given: the smallest worst-case slowdown over {u.dim}=1…4096 ({u.detail})"
        elif u.measured_s is not None:
            why = "fastest measured"
        else:
            why = f"fastest estimated ({u.bound})"
        if dense and any(not v.cls.keeps_dense_weight and v.priority >= 0 for v in usable):
            why += "; a dense copy, allowed"
        elif dense:
            why += "; keeps a dense copy of the weight: nothing that keeps it compressed can run"
        reason = why + (f"; {u.note}" if u.note else "")
        return Candidate(*u.names, u.priority, SELECTED, reason, u.measured_s, estimate, dense)
    if u.held_back:
        reason = DENSE_HELD_BACK
    elif u.time is None and any(v.time is not None for v in usable):
        reason = "declares no cost: ranked by priority"
    elif u.detail:
        reason = u.detail
    elif u.time is not None and u.measured_s is None:
        reason = u.bound
    else:
        reason = u.note
    return Candidate(*u.names, u.priority, USABLE, reason, u.measured_s, estimate, dense)


def _priority(cls: type[Kernel], caps: object) -> tuple[int, str]:
    """The kernel's rank on this device, and what it raised if ranking it raised."""
    try:
        return int(cls.priority_on(caps)), ""  # type: ignore[arg-type]
    except Exception as exc:
        return cls.priority, f"priority_on raised {type(exc).__name__}: {exc}"


def _refusal(cls: type[Kernel], caps: object, problem: Problem | None) -> tuple[str, str]:
    """``(why cls cannot run here or "", what its checks raised or "")``."""
    try:
        reason = cls.check_device(caps)  # type: ignore[arg-type]
    except Exception as exc:
        return "", f"check_device raised {type(exc).__name__}: {exc}"
    if reason:
        return reason, ""
    if problem is None:
        return "", ""
    try:
        ok, why = cls.supports(problem)
    except Exception as exc:
        return "", f"supports raised {type(exc).__name__}: {exc}"
    return ("" if ok else (why or "supports() refused without a reason")), ""


def get_kernel(
    format: str | Format,
    device: str | torch.device = "cpu",
    *,
    problem: Problem | None = None,
    prefer: str | Sequence[str] | None = None,
    tune: bool = False,
    allow_dense: bool | None = None,
    registry: Registry | None = None,
) -> Kernel:
    """The best registered kernel for ``format`` that can run on ``device``: the fastest
    for the problem's shape that keeps the weight compressed (see the module docstring).

    ``problem`` (shape, dtype, format parameters) lets kernels refuse what they cannot
    run and estimate what they cost; without it only device requirements are checked and
    kernels rank by priority. ``allow_dense=True`` (or ``QUANTCORE_ALLOW_DENSE=1``) lets a
    kernel that keeps a dense copy of the weight win on time. Raises
    :class:`~quantcore.errors.NoKernelError` whose message is the explain table.
    Results are cached per (format, device, problem, preferences, environment), and the
    choice is logged once per format, device and shape class (INFO, logger ``quantcore``).
    ``tune=True`` picks the fastest conformant candidate by measurement, once per device
    and shape class (cached on disk; see :mod:`quantcore.tuning`).
    """
    reg = (registry or default_registry()).load()
    state = selection_state(reg)
    key = (
        format, str(device), problem, prefer if not isinstance(prefer, list) else tuple(prefer),
        os.environ.get(ENV_DISABLE), os.environ.get(ENV_FORCE), os.environ.get(ENV_PREFER), tune,
        allow_dense, os.environ.get(ENV_ALLOW_DENSE), measured.generation(),
    )
    hit = state.chosen(key)
    if hit is not None:
        return hit
    fmt = _resolve(format, problem, reg)
    dev = normalize_device(device)
    while True:
        generation, stamp = reg.generation, state.stamp()
        explanation = rank(fmt, dev, problem=problem, prefer=prefer, registry=reg, allow_dense=allow_dense)
        if tune:
            explanation = _tuned(explanation, problem, reg, _allow_dense(allow_dense))
        chosen = explanation.selected
        if chosen is None:
            raise NoKernelError("no kernel can run this request\n" + explanation.table(), explanation)
        try:
            entry = reg.kernel(fmt.name, problem.op if problem else fmt.op, chosen.kernel)
        except PluginError:
            if reg.generation != generation:
                continue  # its plugin was unregistered meanwhile: choose again
            raise
        log_choice(reg, fmt, dev, problem, chosen.kernel, chosen.reason)
        # Never cache an answer the registry (or what selection learnt) has outgrown.
        return state.remember(key, entry.cls(fmt, torch.device(dev)), stamp)
