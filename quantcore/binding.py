"""A kernel bound to one weight: chosen, prepared once, and replaced if it fails.

``get_kernel`` answers from what kernels *declare*. A kernel can still fail when it
meets real weights or runs (a vendor library that breaks at run time, a bug). ``bind``
makes that survivable where it is safe:

* an error in the *input* (``TensorFormatError`` for malformed tensors,
  ``KernelInputError`` for a bad activation) is the caller's, and is raised: every
  other kernel would refuse the same input;
* ``UnsupportedProblemError`` from ``prepare`` means this kernel cannot take these
  particular weights (uneven act-order groups, say): the next candidate is tried;
* any other exception from ``prepare`` or from a call is the kernel's: it is recorded
  as failed on this device (:mod:`quantcore.selection_state`; ``explain`` then shows it
  refused, with the error), and the next candidate is prepared from the same source tensors. A failed
  call produced no output, so retrying it on another kernel is safe.

Every such fallback is logged at WARNING on the ``quantcore`` logger with the error (the
way vLLM reports a kernel it gave up on), and the kernel finally bound at INFO, once per
format, device and shape class.

Binding is thread-safe and idempotent: threads that bind the same tensors (same
objects, same format, device, dtype and problem) share one ``prepare``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .errors import (
    KernelInputError,
    NoKernelError,
    PluginError,
    TensorFormatError,
    UnsupportedProblemError,
)
from .formats.base import Format
from .kernel import Kernel
from .probe import normalize_device
from .problem import Problem
from .registry import Registry, default_registry
from .selection import explain, log_choice, rank
from .selection_state import selection_state

__all__ = ["BoundKernel", "bind"]

log = logging.getLogger(__name__)

_CALLERS_FAULT = (TensorFormatError, KernelInputError)


class BoundKernel:
    """``bound(x, ...)`` runs the kernel on the prepared weight; ``bound.kernel`` says which."""

    def __init__(
        self,
        fmt: Format,
        device: str | torch.device,
        tensors: Mapping[str, torch.Tensor],
        *,
        problem: Problem | None,
        dtype: torch.dtype | None,
        registry: Registry,
        prefer: tuple[str, ...] = (),
        allow_dense: bool | None = None,
    ) -> None:
        self.fmt, self.device, self.problem, self.dtype = fmt, normalize_device(device), problem, dtype
        self.prefer, self.allow_dense = prefer, allow_dense
        self._source = dict(tensors)
        self._registry = registry
        self._lock = threading.Lock()
        #: (kernel, reason) for every candidate passed over while binding this weight.
        self.passed_over: list[tuple[str, str]] = []
        self._reasons: dict[str, str] = {}
        self.kernel, self.prepared = self._first_that_prepares()

    def _candidates(self) -> list[str]:
        expl = rank(self.fmt, self.device, problem=self.problem, prefer=self.prefer or None,
                    registry=self._registry, allow_dense=self.allow_dense)
        self._reasons = {c.kernel: c.reason for c in expl.candidates}
        return [c.kernel for c in expl.candidates if c.status in ("selected", "usable")]

    def _first_that_prepares(self, skip: frozenset[str] = frozenset()) -> tuple[Kernel, Any]:
        op = self.problem.op if self.problem is not None else self.fmt.op
        for name in self._candidates():
            if name in skip or name in {n for n, _ in self.passed_over}:
                continue
            try:
                entry = self._registry.kernel(self.fmt.name, op, name)
            except PluginError:  # unregistered since it was listed
                continue
            kernel = entry.cls(self.fmt, torch.device(self.device))
            try:
                prepared = kernel.prepare(self._source, dtype=self.dtype)
            except _CALLERS_FAULT:
                raise
            except UnsupportedProblemError as exc:
                self._fell_back(name, f"cannot take this weight: {exc}")
            except Exception as exc:
                selection_state(self._registry).record_failure(
                    self.fmt.name, op, name, self.device, f"prepare raised {_short(exc)}")
                self._fell_back(name, f"prepare raised {_short(exc)}")
            else:
                why = self._reasons.get(name, "")
                if self.passed_over:
                    why = f"after {', '.join(n for n, _ in self.passed_over)} failed" + (f"; {why}" if why else "")
                log_choice(self._registry, self.fmt, self.device, self.problem, name, why, how="bound")
                return kernel, prepared
        tried = "; ".join(f"{n}: {why}" for n, why in self.passed_over) or "none usable"
        log.warning("no kernel could prepare a %s weight on %s (%s)", self.fmt.slug, self.device, tried)
        raise NoKernelError(
            f"no kernel could prepare this {self.fmt.slug} weight on {self.device} ({tried})\n"
            + explain(self.fmt, self.device, problem=self.problem, registry=self._registry).table()
        )

    def __call__(self, *inputs: Any, **options: Any) -> Any:
        """The op's call with the prepared weight filled in: ``bound(x)`` for a linear,
        ``bound(x, topk_ids, topk_weights=w)`` for a MoE (kernels take the prepared
        state after their inputs)."""
        kernel, prepared = self.kernel, self.prepared
        try:
            return kernel(*inputs, prepared, **options)  # type: ignore[operator]
        except _CALLERS_FAULT:
            raise
        except Exception as exc:
            with self._lock:
                if self.kernel is kernel:  # no other thread has replaced it yet
                    op = self.problem.op if self.problem is not None else self.fmt.op
                    reason = f"call raised {_short(exc)}"
                    selection_state(self._registry).record_failure(self.fmt.name, op, kernel.name, self.device, reason)
                    self._fell_back(kernel.name, reason)
                    self.kernel, self.prepared = self._first_that_prepares()
            return self(*inputs, **options)

    def _fell_back(self, name: str, reason: str) -> None:
        """A run-time fallback: remembered, and logged at WARNING with the error."""
        self.passed_over.append((name, reason))
        log.warning("%s on %s: %s %s; falling back to the next kernel", self.fmt.slug, self.device, name, reason)

    def __repr__(self) -> str:
        return f"<BoundKernel {self.kernel.name} {self.fmt.slug} on {self.device}>"


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# Bound kernels are cached weakly, keyed by the ids of their source tensors: a bound
# kernel holds those tensors, so while it lives the ids cannot be reused, and when the
# last user drops it the entry goes with it.
_bound: dict[tuple[Any, ...], weakref.ref[BoundKernel]] = {}
_locks: dict[tuple[Any, ...], threading.Lock] = {}
# Re-entrant: a bound kernel collected by the GC while this thread holds the guard runs
# its finalizer (_evict) here, which takes the guard again.
_guard = threading.RLock()


def _lookup(key: tuple[Any, ...]) -> BoundKernel | None:
    ref = _bound.get(key)
    return ref() if ref is not None else None


def _evict(key: tuple[Any, ...]) -> None:
    with _guard:
        ref = _bound.get(key)
        if ref is not None and ref() is None:
            del _bound[key]


def bind(
    format: Format,
    device: str | torch.device,
    tensors: Mapping[str, torch.Tensor],
    *,
    problem: Problem | None = None,
    dtype: torch.dtype | None = None,
    prefer: str | Sequence[str] | None = None,
    allow_dense: bool | None = None,
    registry: Registry | None = None,
) -> BoundKernel:
    """The best kernel for ``format`` on ``device``, prepared for ``tensors`` — once.
    ``allow_dense`` as for :func:`~quantcore.get_kernel`.

    The same tensor objects bound again (from any thread) with the same format, device,
    dtype and problem return the same :class:`BoundKernel` for as long as anyone holds it.
    """
    reg = registry or default_registry()
    prefs = (prefer,) if isinstance(prefer, str) else tuple(prefer or ())
    if not tensors:
        raise TensorFormatError(f"{format.slug}: tensors: expected the stored tensors, got none")
    key = (id(reg), format, normalize_device(device), dtype, problem, prefs, allow_dense,
           tuple((n, id(t)) for n, t in tensors.items()))
    with _guard:
        hit = _lookup(key)
        if hit is not None:
            return hit
        lock = _locks.setdefault(key, threading.Lock())
    with lock:
        with _guard:
            hit = _lookup(key)
        if hit is not None:
            return hit
        made = BoundKernel(format, device, tensors, problem=problem, dtype=dtype, registry=reg, prefer=prefs,
                           allow_dense=allow_dense)
        with _guard:
            _bound[key] = weakref.ref(made)
            weakref.finalize(made, _evict, key)
            _locks.pop(key, None)
        return made
