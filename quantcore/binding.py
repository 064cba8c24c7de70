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
  as failed on this device (:mod:`quantcore.selection.state`; ``explain`` then shows it
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
    InvalidArgumentError,
    KernelInputError,
    NoKernelError,
    TensorFormatError,
    UnsupportedProblemError,
)
from .formats.base import Format
from .kernel import Kernel
from .ops import get_op
from .probe import normalize_device
from .problem import Problem
from .registry import Registry, default_registry
from .selection import explain, log_choice, ranked
from .selection.state import selection_state

__all__ = ["CALLERS_FAULT", "BoundKernel", "bind", "call_failed", "prepare_best"]

log = logging.getLogger(__name__)

#: Errors in the caller's input: every other kernel would refuse it too, so they are raised.
CALLERS_FAULT = (TensorFormatError, KernelInputError)


def prepare_best(
    fmt: Format,
    device: str,
    source: Mapping[str, torch.Tensor],
    *,
    problem: Problem | None,
    dtype: torch.dtype | None,
    prefer: Sequence[str] = (),
    allow_dense: bool | None = None,
    registry: Registry,
    passed_over: list[tuple[str, str]],
) -> tuple[Kernel, Any]:
    """The first kernel of the ranking that prepares ``source``, and what it prepared.
    Kernels in ``passed_over`` are skipped; each one passed over now is appended to it
    (with why) and logged at WARNING; the one bound is logged at INFO."""
    op = problem.op if problem is not None else fmt.op
    skip = {name for name, _ in passed_over}
    for row in ranked(fmt, device, problem=problem, prefer=prefer or None, registry=registry,
                      allow_dense=allow_dense):
        if row.name in skip:
            continue
        kernel = row.cls(fmt, torch.device(device))
        try:
            prepared = kernel.prepare(source, dtype=dtype)
        except CALLERS_FAULT:
            raise
        except UnsupportedProblemError as exc:
            _fell_back(fmt, device, passed_over, row.name, f"cannot take this weight: {exc}")
        except Exception as exc:
            reason = f"prepare raised {_short(exc)}"
            selection_state(registry).record_failure(fmt.name, op, row.name, device, reason)
            _fell_back(fmt, device, passed_over, row.name, reason)
        else:
            why = row.reason
            if passed_over:
                why = f"after {', '.join(n for n, _ in passed_over)} failed" + (f"; {why}" if why else "")
            log_choice(registry, fmt, device, problem, row.name, why, how="bound")
            return kernel, prepared
    tried = "; ".join(f"{n}: {why}" for n, why in passed_over) or "none usable"
    log.warning("no kernel could prepare a %s weight on %s (%s)", fmt.slug, device, tried)
    raise NoKernelError(
        f"no kernel could prepare this {fmt.slug} weight on {device} ({tried})\n"
        + explain(fmt, device, problem=problem, registry=registry).table()
    )


def call_failed(
    fmt: Format, device: str, problem: Problem | None, kernel: Kernel, exc: Exception | None, *,
    registry: Registry, passed_over: list[tuple[str, str]], reason: str = "",
) -> None:
    """A kernel raised in a call (not for the caller's input), or answered what its op
    never returns (``reason``): recorded as failed on ``device``, so no selection offers
    it there again, and passed over for this weight."""
    op = problem.op if problem is not None else fmt.op
    if not reason:
        if exc is None:
            raise InvalidArgumentError(f"call_failed({kernel.name}): expected the exception the call raised "
                                       "or the reason it failed, got neither")
        reason = f"call raised {_short(exc)}"
    selection_state(registry).record_failure(fmt.name, op, kernel.name, device, reason)
    _fell_back(fmt, device, passed_over, kernel.name, reason)


def _fell_back(fmt: Format, device: str, passed_over: list[tuple[str, str]], name: str, reason: str) -> None:
    """A run-time fallback: remembered, and logged at WARNING with the error."""
    passed_over.append((name, reason))
    log.warning("%s on %s: %s %s; falling back to the next kernel", fmt.slug, device, name, reason)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


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
        self._output_checked: Kernel | None = None
        self._weight_dims: dict[str, int] | None = None
        self.kernel, self.prepared = self._prepare()

    def _prepare(self) -> tuple[Kernel, Any]:
        return prepare_best(self.fmt, self.device, self._source, problem=self.problem, dtype=self.dtype,
                            prefer=self.prefer, allow_dense=self.allow_dense, registry=self._registry,
                            passed_over=self.passed_over)

    def __call__(self, *inputs: Any, **options: Any) -> Any:
        """The op's call with the prepared weight filled in: ``bound(x)`` for a linear,
        ``bound(x, topk_ids, topk_weights=w)`` for a MoE (kernels take the prepared
        state after their inputs)."""
        kernel, prepared = self.kernel, self.prepared
        try:
            out = kernel(*inputs, prepared, **options)
        except CALLERS_FAULT:
            raise
        except Exception as exc:
            self._replace(kernel, exc, "")
            return self(*inputs, **options)
        if self._output_checked is not kernel:  # its first call: is the answer of the op's shape?
            wrong = get_op(kernel.op).output_problem(self.fmt, self._dims(), inputs, options, out)
            if wrong:
                self._replace(kernel, None, f"its first call returned a wrong result: {wrong}")
                return self(*inputs, **options)
            self._output_checked = kernel
        return out

    def _replace(self, kernel: Kernel, exc: Exception | None, reason: str) -> None:
        with self._lock:
            if self.kernel is kernel:  # no other thread has replaced it yet
                call_failed(self.fmt, self.device, self.problem, kernel, exc, registry=self._registry,
                            passed_over=self.passed_over, reason=reason)
                self.kernel, self.prepared = self._prepare()

    def _dims(self) -> dict[str, int]:
        if self._weight_dims is None:
            source = self._source
            if len({t.device for t in source.values()}) > 1:
                # Stored tensors on several devices bind (every prepare moves them to its
                # kernel's device); the format reads them on one: the kernel's, for once.
                source = {name: t.to(self.device) for name, t in source.items()}
            self._weight_dims = self.fmt.validate(source)
        return self._weight_dims

    def __repr__(self) -> str:
        return f"<BoundKernel {self.kernel.name} {self.fmt.slug} on {self.device}>"


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
    try:
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
            return made
    finally:
        with _guard:  # bound or failed, the key's lock is done with (threads holding it still finish)
            if _locks.get(key) is lock:
                del _locks[key]
