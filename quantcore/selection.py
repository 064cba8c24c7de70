"""Choosing a kernel: rank every candidate, keep the reason for every refusal.

``explain`` only reads: it ranks and says why, and changes nothing. ``get_kernel`` (and
``bind``) act on the ranking: they cache the choice and record a kernel whose own checks
raise as failed on that device (:mod:`quantcore.selection_state`).

Environment variables (comma-separated kernel or plugin names):

``QUANTCORE_DISABLE``  never choose these.
``QUANTCORE_FORCE``    choose only this one; if it cannot run, fail and say why.
``QUANTCORE_PREFER``   try these first, in this order (``prefer=`` overrides it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from tabulate import tabulate

from .errors import InvalidArgumentError, NoKernelError, PluginError, UnknownFormatError
from .formats.base import Format
from .kernel import Kernel
from .probe import normalize_device, probe
from .problem import Problem
from .registry import Registry, default_registry
from .selection_state import FailureKey, SelectionState, selection_state

__all__ = ["ENV_DISABLE", "ENV_FORCE", "ENV_PREFER", "Candidate", "Explanation", "explain", "get_kernel", "rank"]

ENV_DISABLE = "QUANTCORE_DISABLE"
ENV_FORCE = "QUANTCORE_FORCE"
ENV_PREFER = "QUANTCORE_PREFER"

SELECTED, USABLE, REFUSED, DISABLED, BROKEN = "selected", "usable", "refused", "disabled", "broken"


@dataclass(frozen=True)
class Candidate:
    kernel: str
    plugin: str
    priority: int
    status: str
    reason: str = ""
    #: Median seconds per call when ``tune=True`` measured it.
    measured_s: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "kernel": self.kernel,
            "plugin": self.plugin,
            "priority": self.priority,
            "status": self.status,
            "reason": self.reason,
            "measured_s": self.measured_s,
        }


@dataclass(frozen=True)
class Explanation:
    """Every candidate for a request, chosen or refused, and why. ``str()`` is the table."""

    format: str
    device: str
    problem: str
    candidates: tuple[Candidate, ...] = field(default=())

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
            "candidates": [c.as_dict() for c in self.candidates],
        }

    def table(self) -> str:
        head = f"{self.format} on {self.device}" + (f" for {self.problem}" if self.problem else "")
        if not self.candidates:
            return f"{head}: no kernel is registered for this format"
        timed = any(c.measured_s is not None for c in self.candidates)
        headers = ["kernel", "plugin", "priority", "status", *(["measured µs"] if timed else []), "reason"]
        rows = [
            [c.kernel, c.plugin, c.priority, c.status,
             *([f"{c.measured_s * 1e6:.1f}" if c.measured_s is not None else ""] if timed else []), c.reason]
            for c in self.candidates
        ]
        return head + "\n" + tabulate(rows, headers=headers, tablefmt="simple")

    __str__ = table


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


def explain(
    format: str | Format,
    device: str | torch.device = "cpu",
    *,
    problem: Problem | None = None,
    prefer: str | Sequence[str] | None = None,
    tune: bool = False,
    registry: Registry | None = None,
) -> Explanation:
    """Rank every kernel registered for ``format`` on ``device``, as data; records nothing
    (a kernel whose checks raise is shown refused with the error, and ``get_kernel`` or
    ``bind`` will record it). With ``tune=True`` the usable candidates are checked and timed
    (see :mod:`quantcore.tuning`) and the table shows what was measured."""
    reg = registry or default_registry()
    fmt = _resolve(format, problem, reg)
    expl, _ = _explain(fmt, normalize_device(device), problem, _prefer_tuple(prefer), reg)
    return _tuned(expl, problem, reg) if tune else expl


def rank(
    fmt: Format,
    device: str,
    *,
    problem: Problem | None,
    prefer: str | Sequence[str] | None,
    registry: Registry,
) -> Explanation:
    """``explain`` for those about to act on the answer (``get_kernel``, ``bind``): a kernel
    whose own checks raised is recorded as failed on ``device``, refused from then on."""
    expl, broke = _explain(fmt, device, problem, _prefer_tuple(prefer), registry)
    state = selection_state(registry)
    for key, reason in broke.items():
        state.record_failure(*key, reason)
    return expl


def _tuned(expl: Explanation, problem: Problem | None, reg: Registry) -> Explanation:
    """Re-rank the usable candidates of ``expl`` by measured time."""
    if problem is None:
        raise InvalidArgumentError("problem: tune=True needs a problem, the measurement is per shape")
    from .tuning import tuned

    usable = [c for c in expl.candidates if c.status in (SELECTED, USABLE)]
    if len(usable) < 2:
        return expl
    result = tuned(problem, expl.device, [c.kernel for c in usable], reg)
    ranked: list[Candidate] = []
    for c in sorted(usable, key=lambda c: result.seconds.get(c.kernel, float("inf"))):
        t = result.seconds.get(c.kernel)
        if c.kernel in result.refused:
            ranked.append(Candidate(c.kernel, c.plugin, c.priority, REFUSED, f"tuning: {result.refused[c.kernel]}"))
        elif c.kernel == result.winner:
            ranked.append(Candidate(c.kernel, c.plugin, c.priority, SELECTED, "fastest measured", t))
        else:
            ranked.append(Candidate(c.kernel, c.plugin, c.priority, USABLE, "", t))
    rest = [c for c in expl.candidates if c.status not in (SELECTED, USABLE)]
    return Explanation(expl.format, expl.device, expl.problem, tuple(ranked + rest))


def _prefer_tuple(prefer: str | Sequence[str] | None) -> tuple[str, ...]:
    if prefer is None:
        return _env_names(ENV_PREFER)
    if isinstance(prefer, str):
        return (prefer,)
    return tuple(prefer)


def _explain(
    fmt: Format, device: str, problem: Problem | None, prefer: tuple[str, ...], reg: Registry
) -> tuple[Explanation, dict[FailureKey, str]]:
    """The ranking, and the kernels whose checks raised just now (for the caller to record)."""
    caps = probe(device)
    state: SelectionState = selection_state(reg)
    broken_now: dict[FailureKey, str] = {}
    disabled, forced = _env_names(ENV_DISABLE), _env_names(ENV_FORCE)
    op = problem.op if problem is not None else fmt.op
    usable: list[tuple[tuple[int, int, str], Candidate]] = []
    others: list[Candidate] = []
    for entry in reg.kernels(fmt.name, op):
        cls, names = entry.cls, (entry.cls.name, entry.plugin)
        priority, broke = _priority(cls, caps)
        if _match(names, disabled):
            others.append(Candidate(*names, priority, DISABLED, f"{ENV_DISABLE}={','.join(disabled)}"))
            continue
        if forced and not _match(names, forced):
            others.append(Candidate(*names, priority, REFUSED, f"{ENV_FORCE}={','.join(forced)}"))
            continue
        failed = state.failure(fmt.name, op, cls.name, device)
        reason = ""
        if not failed:
            reason, raised = _refusal(cls, caps, problem)
            broke = broke or raised
            if broke:
                # A kernel whose own checks raise is buggy: refused here, and (once someone
                # acts on this ranking) from now on on this device, like one that fails in
                # prepare or in a call.
                broken_now[(fmt.name, op, cls.name, device)] = broke
                failed = broke
        if failed:
            reason = f"failed at run time: {failed}"
        if reason:
            others.append(Candidate(*names, priority, REFUSED, reason))
            continue
        note = "" if problem is not None else "no problem given: shape and dtype limits unchecked"
        rank_prefer = next((i for i, n in enumerate(prefer) if n in names), len(prefer))
        usable.append(((rank_prefer, -priority, cls.name), Candidate(*names, priority, USABLE, note)))
    usable.sort(key=lambda item: item[0])
    ranked = [c for _, c in usable]
    if ranked:
        first = ranked[0]
        why = "highest priority" if not prefer or first.kernel not in prefer else "preferred"
        ranked[0] = Candidate(
            first.kernel, first.plugin, first.priority, SELECTED,
            why + (f"; {first.reason}" if first.reason else ""),
        )
    broken = [Candidate("-", b.plugin, 0, BROKEN, f"{b.stage}: {b.error}") for b in reg.broken()]
    explanation = Explanation(
        format=fmt.slug,
        device=device,
        problem=problem.describe() if problem is not None else "",
        candidates=tuple(ranked + others + broken),
    )
    return explanation, broken_now


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
    registry: Registry | None = None,
) -> Kernel:
    """The best registered kernel for ``format`` that can run on ``device``.

    ``problem`` (shape, dtype, format parameters) lets kernels refuse what they cannot
    run; without it only device requirements are checked. Raises
    :class:`~quantcore.errors.NoKernelError` whose message is the explain table.
    Results are cached per (format, device, problem, preferences, environment).
    ``tune=True`` picks the fastest conformant candidate by measurement, once per device
    and shape class (cached on disk; see :mod:`quantcore.tuning`).
    """
    reg = (registry or default_registry()).load()
    state = selection_state(reg)
    key = (
        format, str(device), problem, prefer if not isinstance(prefer, list) else tuple(prefer),
        os.environ.get(ENV_DISABLE), os.environ.get(ENV_FORCE), os.environ.get(ENV_PREFER), tune,
    )
    hit = state.chosen(key)
    if hit is not None:
        return hit
    fmt = _resolve(format, problem, reg)
    dev = normalize_device(device)
    while True:
        generation, stamp = reg.generation, state.stamp()
        explanation = rank(fmt, dev, problem=problem, prefer=prefer, registry=reg)
        if tune:
            explanation = _tuned(explanation, problem, reg)
        chosen = explanation.selected
        if chosen is None:
            raise NoKernelError("no kernel can run this request\n" + explanation.table(), explanation)
        try:
            entry = reg.kernel(fmt.name, problem.op if problem else fmt.op, chosen.kernel)
        except PluginError:
            if reg.generation != generation:
                continue  # its plugin was unregistered meanwhile: choose again
            raise
        # Never cache an answer the registry (or what selection learnt) has outgrown.
        return state.remember(key, entry.cls(fmt, torch.device(dev)), stamp)

