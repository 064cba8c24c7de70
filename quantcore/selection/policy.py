"""The choosing policy: which registered kernels can run a request, and in what order.

How the candidates that can run are ordered (the first is chosen):

1. ``prefer=`` (or ``QUANTCORE_PREFER``) names, in their order.
2. Memory: a kernel that keeps a dense copy of the weight (``Kernel.keeps_dense_weight``,
   e.g. ``torch_fallback``) comes after every kernel that keeps it compressed, unless the
   caller allows dense copies (``allow_dense=True`` or ``QUANTCORE_ALLOW_DENSE=1``), names it
   in ``prefer``, or nothing compressed can run. A kernel with a negative priority on the
   device (Triton's interpreter on a CPU: a correctness tool, run when asked for by name)
   does not count as something compressed that can run.
3. Time for the shape. Times the tuner measured for this request (``tune=True``) rank the
   candidates it passed, and those it failed are refused. Otherwise a measured entry for
   this device and shape class that covers every candidate (this machine's cache, then the
   tables shipped in the package; :mod:`quantcore.measured`) ranks by measured time.
   Otherwise the kernels that declare a cost (:meth:`Kernel.cost`, :mod:`quantcore.cost`)
   rank by their estimates and stand together at the highest priority among them, so that
   a kernel declaring none still ranks by its priority against them. A problem without its
   batch dim (M unknown, as for a module built before it sees an input) ranks by the worst
   slowdown against the fastest over M = 1 … 4096, so one kernel that is 25× off at
   prefill never wins for a 10 % gain at decode.
4. Priority (``Kernel.priority_on``), then name.

A kernel is refused, with the reason, when it is disabled or another one is forced, when
it failed on this device before, when the device lacks what it requires or ``supports``
refuses the problem, and when one of its own checks (``priority_on``, ``check_device``,
``supports``, ``cost``) raises: such a kernel is buggy, and whoever acts on the ranking
records it as failed on the device.

The policy weighs only what it is given (the probed device, measured entries, known
failures); :mod:`quantcore.selection` gathers those and acts on the answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..cost import BATCH_SIZES, Cost, DeviceRates, batch_dim, with_batch
from ..kernel import Kernel
from ..measured import Measurement
from ..probe import Capabilities
from ..problem import Problem
from ..registry import KernelEntry
from .environment import ENV_DISABLE, ENV_FORCE, Overrides
from .explanation import DISABLED, REFUSED, SELECTED, USABLE, Candidate

__all__ = ["DENSE_HELD_BACK", "Ranking", "Row", "rank"]

DENSE_HELD_BACK = ("keeps a dense copy of the weight: chosen only when nothing that keeps it compressed "
                   "can run, or with allow_dense=True")
NO_COST = "priority (no kernel declares a cost)"


@dataclass
class Row:
    """One candidate that can run, as the policy weighs it."""

    cls: type[Kernel]
    plugin: str
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
    reason: str = ""

    @property
    def name(self) -> str:
        return self.cls.name

    @property
    def dense(self) -> bool:
        return bool(self.cls.keeps_dense_weight)

    @property
    def estimate(self) -> float | None:
        """The estimate at the problem's own batch size (None over a sweep of sizes)."""
        return next(iter(self.estimated.values())) if len(self.estimated) == 1 else None

    def candidate(self, status: str, reason: str) -> Candidate:
        return Candidate(self.name, self.plugin, self.priority, status, reason, self.measured_s, self.estimate,
                         self.dense)


@dataclass
class Ranking:
    """The kernels that can run, best first (each with why it stands there), and the
    refused ones with why not."""

    usable: list[Row]
    refused: list[Candidate]
    #: What ordered ``usable``: measured times, declared costs or priorities.
    basis: str = ""
    #: Kernels whose own checks raised just now: kernel name → what raised.
    broken: dict[str, str] = field(default_factory=dict)

    @property
    def first(self) -> Row | None:
        return self.usable[0] if self.usable else None

    def candidates(self) -> list[Candidate]:
        return [u.candidate(SELECTED if i == 0 else USABLE, u.reason) for i, u in enumerate(self.usable)] + self.refused


def rank(
    entries: Sequence[KernelEntry],
    caps: Capabilities,
    rates: DeviceRates,
    problem: Problem | None,
    overrides: Overrides,
    *,
    failure: Callable[[str], str | None],
    measured: Callable[[Problem], Measurement | None],
    tune: Callable[[list[str]], Measurement] | None = None,
) -> Ranking:
    """Rank ``entries``, the kernels registered for the request's format and op.
    ``failure(name)``: why a kernel failed on this device before, or None.
    ``measured(problem)``: the measured entry of a shape, or None.
    ``tune(names)``: times measured now for the candidates that can run (``tune=True``)."""
    ranking = _screen(entries, caps, rates, problem, overrides, failure)
    tuned = None
    if tune is not None and len(ranking.usable) >= 2:
        tuned = tune([u.name for u in ranking.usable])
        failed = [u for u in ranking.usable if u.name in tuned.refused]
        ranking.refused[:0] = [u.candidate(REFUSED, f"tuning: {tuned.refused[u.name]}") for u in failed]
        ranking.usable = [u for u in ranking.usable if u.name not in tuned.refused]
    if ranking.usable:
        compressed = compressed_can_run(ranking.usable)
        ranking.basis = _order(ranking.usable, rates, problem, overrides, compressed, measured, tuned)
        _give_reasons(ranking.usable, overrides.prefer, compressed)
    return ranking


def compressed_can_run(rows: Sequence[Row]) -> bool:
    """Whether a kernel that keeps the weight compressed can run (a negative priority, a
    correctness tool run only by name, does not count)."""
    return any(not r.dense and r.priority >= 0 for r in rows)


# --- screening: who can run -------------------------------------------------------------------


def _screen(entries: Sequence[KernelEntry], caps: Capabilities, rates: DeviceRates, problem: Problem | None,
            overrides: Overrides, failure: Callable[[str], str | None]) -> Ranking:
    sizes = _batch_sizes(problem)
    dim = batch_dim(problem) if problem is not None else "M"
    prefer, disabled, forced = overrides.prefer, overrides.disabled, overrides.forced
    ranking = Ranking([], [])
    for entry in entries:
        cls, names = entry.cls, (entry.cls.name, entry.plugin)
        priority, broke = _priority(cls, caps)
        dense = bool(getattr(cls, "keeps_dense_weight", False))
        if _match(names, disabled):
            ranking.refused.append(Candidate(*names, priority, DISABLED, f"{ENV_DISABLE}={','.join(disabled)}",
                                             keeps_dense=dense))
            continue
        if forced and not _match(names, forced):
            ranking.refused.append(Candidate(*names, priority, REFUSED, f"{ENV_FORCE}={','.join(forced)}",
                                             keeps_dense=dense))
            continue
        failed = failure(cls.name)
        reason, bound = "", ""
        estimated: dict[int, float] = {}
        if not failed:
            reason, raised = _refusal(cls, caps, problem)
            broke = broke or raised
            if not reason and not broke and problem is not None and sizes:
                estimated, bound, broke = _estimates(cls, caps, rates, problem, sizes)
            if broke:
                ranking.broken[cls.name] = broke
                failed = broke
        if failed:
            reason = f"failed at run time: {failed}"
        if reason:
            ranking.refused.append(Candidate(*names, priority, REFUSED, reason, keeps_dense=dense))
            continue
        note = "" if problem is not None else "no problem given: shape and dtype limits unchecked"
        prefer_rank = next((i for i, n in enumerate(prefer) if n in names), len(prefer))
        ranking.usable.append(Row(cls, entry.plugin, priority, prefer_rank, note, estimated, bound, dim=dim))
    return ranking


def _match(names: tuple[str, str], wanted: Sequence[str]) -> bool:
    return names[0] in wanted or names[1] in wanted


def _priority(cls: type[Kernel], caps: Capabilities) -> tuple[int, str]:
    """The kernel's rank on this device, and what it raised if ranking it raised."""
    try:
        return int(cls.priority_on(caps)), ""
    except Exception as exc:
        return cls.priority, f"priority_on raised {type(exc).__name__}: {exc}"


def _refusal(cls: type[Kernel], caps: Capabilities, problem: Problem | None) -> tuple[str, str]:
    """``(why cls cannot run here or "", what its checks raised or "")``."""
    try:
        reason = cls.check_device(caps)
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


def _batch_sizes(problem: Problem | None) -> tuple[int, ...]:
    """The batch sizes a problem is judged at: its own, or all of BATCH_SIZES without one."""
    if problem is None:
        return ()
    own = problem.get(batch_dim(problem))
    return (own,) if own is not None else BATCH_SIZES


def _at(problem: Problem, size: int) -> Problem:
    return problem if problem.get(batch_dim(problem)) == size else with_batch(problem, size)


def _estimates(cls: type[Kernel], caps: Capabilities, rates: DeviceRates, problem: Problem,
               sizes: tuple[int, ...]) -> tuple[dict[int, float], str, str]:
    """``(seconds by batch size, what bounds the first, what cost raised or "")``. A kernel
    declaring no cost, or whose cost needs a dim the problem lacks, has no estimates."""
    out: dict[int, float] = {}
    bound = ""
    if any(v < 0 for _, v in problem.dims):
        return {}, "", ""  # a malformed problem is the caller's, not a reason to blame a kernel
    for b in sizes:
        try:
            cost = cls.cost(caps, _at(problem, b))
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


# --- ordering: who goes first -----------------------------------------------------------------


def _order(usable: list[Row], rates: DeviceRates, problem: Problem | None, overrides: Overrides, compressed: bool,
           measured: Callable[[Problem], Measurement | None], tuned: Measurement | None) -> str:
    """Sort ``usable`` in place (the first is chosen) and return what ranked it."""
    n_prefer = len(overrides.prefer)
    for u in usable:
        u.held_back = u.dense and compressed and not overrides.allow_dense and u.prefer_rank == n_prefer
    basis = NO_COST
    sizes = _batch_sizes(problem)
    if problem is not None and sizes:
        times, basis = _times(usable, rates, problem, sizes, measured, tuned)
        if len(sizes) == 1:
            for u in usable:
                u.time = times[sizes[0]].get(u.name)
        else:
            _worst_slowdowns(usable, times, sizes)
    timed = [u.priority for u in usable if u.time is not None]
    block = max(timed) if timed else 0

    def key(u: Row) -> tuple[object, ...]:
        if u.time is not None:
            return (u.prefer_rank, u.held_back, -block, 0, u.time, -u.priority, u.name)
        return (u.prefer_rank, u.held_back, -u.priority, 1, 0.0, -u.priority, u.name)

    usable.sort(key=key)
    return basis


def _times(usable: list[Row], rates: DeviceRates, problem: Problem, sizes: tuple[int, ...],
           measured: Callable[[Problem], Measurement | None],
           tuned: Measurement | None) -> tuple[dict[int, dict[str, float]], str]:
    """Seconds per kernel per batch size: tuned now, or measured where an entry covers
    every candidate, else the declared estimates; and what they rest on."""
    names = [u.name for u in usable]
    times: dict[int, dict[str, float]] = {}
    sources: set[str] = set()
    for b in sizes:
        m = tuned if tuned is not None else measured(_at(problem, b))
        if m is not None and m.covers(names):
            times[b] = {n: m.seconds.get(n, math.inf) for n in names}
            sources.add(f"{m.source}" + (f", {m.timing}" if m.timing else ""))
            if len(sizes) == 1:
                for u in usable:
                    u.measured_s = m.seconds.get(u.name)
                    u.detail = f"refused by the tuner: {m.refused[u.name]}" if u.name in m.refused else ""
        else:
            times[b] = {u.name: u.estimated[b] for u in usable if b in u.estimated}
    if tuned is not None:
        return times, f"times measured on this device ({tuned.timing or 'cached'})"
    estimated = len(sources) < len(sizes) and any(u.estimated for u in usable)
    parts = ([f"measured times ({'; '.join(sorted(sources))})"] if sources else []) + (
        [f"declared costs (device rates {rates.source})"] if estimated else [])
    return times, " and ".join(parts) if parts else NO_COST


def _worst_slowdowns(usable: list[Row], times: dict[int, dict[str, float]], sizes: tuple[int, ...]) -> None:
    """Without a batch size: each kernel's worst ratio to the fastest of its memory class,
    over every batch size (``time`` = that ratio, ``detail`` says where)."""
    for u in usable:
        if not all(u.name in times[b] for b in sizes):
            continue
        worst, where = 0.0, sizes[0]
        for b in sizes:
            peers = [times[b][v.name] for v in usable if v.held_back == u.held_back and v.name in times[b]]
            ratio = times[b][u.name] / min(peers) if min(peers) > 0 else 1.0
            if ratio > worst:
                worst, where = ratio, b
        u.time = worst
        u.detail = f"worst {worst:.2f}× the fastest, at {u.dim}={where}"


def _give_reasons(usable: list[Row], prefer: tuple[str, ...], compressed: bool) -> None:
    """Why each usable kernel stands where it does (the first: why it was chosen)."""
    any_timed = any(v.time is not None for v in usable)
    first = usable[0]
    if prefer and first.name in prefer:
        why = "preferred"
    elif first.time is None:
        why = "highest priority" + (" (declares no cost)" if any_timed else "")
    elif len(first.estimated) > 1:
        why = f"no {first.dim} given: the smallest worst-case slowdown over {first.dim}=1…4096 ({first.detail})"
    elif first.measured_s is not None:
        why = "fastest measured"
    else:
        why = f"fastest estimated ({first.bound})"
    if first.dense:
        why += ("; a dense copy, allowed" if compressed
                else "; keeps a dense copy of the weight: nothing that keeps it compressed can run")
    first.reason = why + (f"; {first.note}" if first.note else "")
    for u in usable[1:]:
        if u.held_back:
            u.reason = DENSE_HELD_BACK
        elif u.time is None and any_timed:
            u.reason = "declares no cost: ranked by priority"
        elif u.detail:
            u.reason = u.detail
        elif u.time is not None and u.measured_s is None:
            u.reason = u.bound
        else:
            u.reason = u.note
