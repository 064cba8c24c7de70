"""What choosing kernels has learnt about one registry: the kernels ``get_kernel`` chose
(a cache) and the kernels that failed on a device (refused there from then on).

The registry holds the plugins and what they contribute; this holds what selection and
binding learn while using them, so the registry knows nothing of either. One state per
registry, made on first use and dropped with the registry. Cached choices are dropped
whenever the registry changes (its ``generation`` moves) and whenever a failure is
recorded or cleared.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ..kernel import Kernel
from ..registry import Registry

__all__ = ["FailureKey", "SelectionState", "selection_state"]

#: (format name, op, kernel name, device)
FailureKey = tuple[str, str, str, str]


class SelectionState:
    def __init__(self, registry: Registry) -> None:
        self._registry = weakref.ref(registry)
        self._lock = threading.RLock()
        self._chosen: dict[tuple[Any, ...], Kernel] = {}
        self._failures: dict[FailureKey, str] = {}
        self._generation = registry.generation
        self._version = 0
        self._said: set[tuple[Any, ...]] = set()

    # --- failures ---------------------------------------------------------------------------

    @property
    def failures(self) -> dict[FailureKey, str]:
        """A copy: (format, op, kernel, device) -> why the kernel failed there."""
        with self._lock:
            return dict(self._failures)

    def failure(self, format_name: str, op: str, kernel: str, device: str) -> str | None:
        with self._lock:
            return self._failures.get((format_name, op, kernel, device))

    def record_failure(self, format_name: str, op: str, kernel: str, device: str, reason: str) -> None:
        """A kernel failed on ``device`` (its checks raised, or prepare or a call did):
        selection refuses it there from now on."""
        with self._lock:
            self._failures[(format_name, op, kernel, device)] = reason
            self._forget_choices()

    def clear_failures(self) -> None:
        with self._lock:
            self._failures.clear()
            self._forget_choices()

    # --- what was logged -----------------------------------------------------------------------

    def first_time(self, key: tuple[Any, ...]) -> bool:
        """True the first time ``key`` is asked about (log a choice once, not per call)."""
        with self._lock:
            if key in self._said:
                return False
            self._said.add(key)
            return True

    # --- cached choices ---------------------------------------------------------------------

    def stamp(self) -> tuple[int, int]:
        """Changes whenever a cached choice could be wrong: the registry's generation and
        this state's own version (bumped by every failure recorded or cleared)."""
        registry = self._registry()
        return (registry.generation if registry is not None else -1, self._version)

    def chosen(self, key: tuple[Any, ...]) -> Kernel | None:
        with self._lock:
            self._follow_registry()
            return self._chosen.get(key)

    def remember(self, key: tuple[Any, ...], kernel: Kernel, stamp: tuple[int, int]) -> Kernel:
        """Cache ``kernel`` for ``key`` unless something changed since ``stamp`` was taken
        (then the choice is returned, never cached). Threads that chose at once all get the
        first one cached."""
        with self._lock:
            self._follow_registry()
            if stamp != self.stamp():
                return kernel
            return self._chosen.setdefault(key, kernel)

    def _follow_registry(self) -> None:
        registry = self._registry()
        if registry is not None and registry.generation != self._generation:
            self._generation = registry.generation
            self._chosen.clear()

    def _forget_choices(self) -> None:
        self._version += 1
        self._chosen.clear()


_states: weakref.WeakKeyDictionary[Registry, SelectionState] = weakref.WeakKeyDictionary()
_guard = threading.Lock()


def selection_state(registry: Registry) -> SelectionState:
    """The selection state of ``registry`` (made on first use)."""
    state = _states.get(registry)
    if state is None:
        with _guard:
            state = _states.get(registry)
            if state is None:
                state = _states[registry] = SelectionState(registry)
    return state
