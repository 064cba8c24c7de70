"""Choosing a kernel: rank every candidate, keep the reason for every refusal.

``explain`` only reads: it ranks and says why, and changes nothing. ``get_kernel`` (and
:func:`quantcore.bind`, through :func:`ranked`) act on the ranking: they cache the
choice, log it once per format, device and shape class (INFO, logger ``quantcore``), and
record a kernel whose own checks raise as failed on that device.

``policy.py``       the rules: who can run, in what order, and why (read it for the order)
``explanation.py``  :class:`Explanation`, the answer as data, and its table
``environment.py``  ``prefer`` / ``allow_dense`` and the ``QUANTCORE_*`` variables
``state.py``        what choosing learnt: cached choices, kernels failed on a device
``log.py``          the INFO line per choice

This module gathers what the policy weighs (the probed device, measured times, the
tuner's, known failures), asks it for the ranking (``explain`` also for the first kernel
at every batch size), and builds one :class:`Explanation` per call.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from .. import measured, tuning
from ..cost import BATCH_SIZES, batch_dim, device_rates, with_batch
from ..errors import InvalidArgumentError, NoKernelError, QuantCoreWarning, UnknownFormatError
from ..formats.base import Format
from ..kernel import Kernel
from ..probe import normalize_device, probe
from ..problem import Problem
from ..registry import Registry, default_registry
from .environment import (
    ENV_ALLOW_DENSE,
    ENV_DISABLE,
    ENV_FORCE,
    ENV_PREFER,
    Overrides,
    environment_key,
)
from .explanation import BROKEN, Candidate, Explanation
from .log import log_choice
from .policy import DENSE_HELD_BACK, Ranking, Row, rank
from .state import selection_state

__all__ = [
    "DENSE_HELD_BACK",
    "ENV_ALLOW_DENSE",
    "ENV_DISABLE",
    "ENV_FORCE",
    "ENV_PREFER",
    "Candidate",
    "Explanation",
    "explain",
    "get_kernel",
    "log_choice",
    "ranked",
]


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
    fmt = _format(format, problem, reg, tune)
    _check_prefer(reg, prefer)
    dev, overrides = normalize_device(device), Overrides.read(prefer, allow_dense)
    ranking = _rank(reg, fmt, dev, problem, overrides, tune=tune)
    by_batch: tuple[tuple[int, str | None], ...] = ()
    if problem is not None:
        by_batch = tuple((b, _first_name(_rank(reg, fmt, dev, with_batch(problem, b), overrides)))
                         for b in BATCH_SIZES)
    return _explanation(reg, fmt, dev, problem, ranking, by_batch)


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
    for the problem's shape that keeps the weight compressed (see :mod:`.policy`).

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
    key = (format, str(device), problem, prefer if not isinstance(prefer, list) else tuple(prefer),
           environment_key(), tune, allow_dense, measured.generation())
    hit = state.chosen(key)
    if hit is not None:
        return hit
    fmt = _format(format, problem, reg, tune)
    _check_prefer(reg, prefer)
    dev = normalize_device(device)
    stamp = state.stamp()
    ranking = _rank(reg, fmt, dev, problem, Overrides.read(prefer, allow_dense), tune=tune, act=True)
    chosen = ranking.first
    if chosen is None:
        expl = _explanation(reg, fmt, dev, problem, ranking)
        raise NoKernelError("no kernel can run this request\n" + expl.table(), expl)
    log_choice(reg, fmt, dev, problem, chosen.name, chosen.reason)
    # Never cache an answer the registry (or what selection learnt) has outgrown.
    return state.remember(key, chosen.cls(fmt, torch.device(dev)), stamp)


def ranked(
    fmt: Format,
    device: str,
    *,
    problem: Problem | None,
    prefer: str | Sequence[str] | None,
    registry: Registry,
    allow_dense: bool | None = None,
) -> list[Row]:
    """The kernels that can run, best first, for those about to prepare them in turn
    (:func:`quantcore.bind`): a kernel whose own checks raised is recorded as failed on
    ``device``, refused from then on."""
    _check_prefer(registry, prefer)
    return _rank(registry, fmt, device, problem, Overrides.read(prefer, allow_dense), act=True).usable


def _rank(reg: Registry, fmt: Format, device: str, problem: Problem | None, overrides: Overrides, *,
          tune: bool = False, act: bool = False) -> Ranking:
    """The policy's ranking, from what this device, the measured tables, the tuner (with
    ``tune``) and the known failures say. ``act``: record the kernels whose checks raised."""
    caps = probe(device)
    op = problem.op if problem is not None else fmt.op
    state = selection_state(reg)
    entries = reg.kernels(fmt.name, op)
    known = {e.cls.name for e in entries}.__contains__

    def tuned(names: list[str]) -> measured.Measurement:
        assert problem is not None
        result = tuning.tuned(problem, device, names, reg)
        return measured.Measurement(result.seconds, result.refused, result.timing)

    ranking = rank(
        entries, caps, device_rates(caps), problem, overrides,
        failure=lambda name: state.failure(fmt.name, op, name, device),
        measured=lambda p: measured.lookup(p, caps.name, known=known),
        tune=tuned if tune else None,
    )
    if act:
        for name, reason in ranking.broken.items():
            state.record_failure(fmt.name, op, name, device, reason)
    return ranking


def _explanation(reg: Registry, fmt: Format, device: str, problem: Problem | None, ranking: Ranking,
                 by_batch: tuple[tuple[int, str | None], ...] = ()) -> Explanation:
    broken = [Candidate("-", b.plugin, 0, BROKEN, f"{b.stage}: {b.error}") for b in reg.broken()]
    return Explanation(
        format=fmt.slug,
        device=device,
        problem=problem.describe() if problem is not None else "",
        candidates=tuple(ranking.candidates() + broken),
        basis=ranking.basis,
        by_batch=by_batch,
        batch_dim=batch_dim(problem) if problem is not None else "M",
    )


def _first_name(ranking: Ranking) -> str | None:
    return ranking.first.name if ranking.first is not None else None


def _check_prefer(registry: Registry, prefer: object) -> None:
    """``prefer=`` must name a kernel or plugin the registry holds (for any format). A
    list may also name ones not installed here (one list for several machines): those
    are warned about once; a preference naming nothing known is an error (a typo would
    otherwise be ignored in silence)."""
    if prefer is None:
        return
    names = [prefer] if isinstance(prefer, str) else prefer
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise InvalidArgumentError(f"prefer: expected a kernel name or a sequence of names, got {prefer!r:.80}")
    known = {e.cls.name for e in registry.kernels()} | {p.name for p in registry.plugins()}
    unknown = [n for n in names if n not in known]
    if not unknown:
        return
    kernels = ", ".join(sorted({e.cls.name for e in registry.kernels()}))
    if len(unknown) == len(names):
        raise InvalidArgumentError(f"prefer: no registered kernel or plugin is called {', '.join(map(repr, unknown))}; "
                                   f"kernels: {kernels}")
    for name in unknown:
        if name not in _warned_prefer:
            _warned_prefer.add(name)
            warnings.warn(f"prefer: no registered kernel or plugin is called {name!r}; it is skipped (kernels: "
                          f"{kernels})", QuantCoreWarning, stacklevel=4)


#: Unknown ``prefer`` names already warned about.
_warned_prefer: set[str] = set()


def _format(format: str | Format, problem: Problem | None, registry: Registry, tune: bool) -> Format:
    if tune and problem is None:
        raise InvalidArgumentError("problem: tune=True needs a problem, the measurement is per shape")
    if problem is not None:
        if isinstance(format, Format) and format != problem.format:
            raise InvalidArgumentError(f"format: {format.slug} disagrees with problem.format {problem.format.slug}")
        if isinstance(format, str) and format != problem.format.name:
            raise UnknownFormatError(f"format: {format!r} disagrees with problem.format {problem.format.name!r}")
        return problem.format
    if isinstance(format, Format):
        return format
    return registry.format_class(format)()
