"""Benchmark suites, one module each, looked up by name (``quantcore bench SUITE``).

A suite module defines:

``DESCRIPTION``  one line.
``SHAPES``       named shape sets, ``{"decode": [{"M": 1, "K": 4096, "N": 4096}, ...], ...}``;
                 the set named ``"default"`` runs when none is asked for.
``cases(device, shapes)``  yields :class:`~quantcore.benchmarks.spec.BenchCase`, one per
                 shape, built lazily so each case's tensors are freed before the next.
``summarize(rows)`` (optional) returns note lines (targets met or missed) for the report.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from quantcore.errors import InvalidArgumentError

__all__ = ["available", "get_suite"]


def get_suite(name: str) -> ModuleType:
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise InvalidArgumentError(f"bench suite: expected one of {available()} or all, got {name!r}") from None


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
