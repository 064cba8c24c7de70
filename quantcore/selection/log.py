"""What choosing says on the ``quantcore`` logger: each choice at INFO, once per format,
device and shape class (a model's hundred layers of one shape log one line)."""

from __future__ import annotations

import logging

from ..cost import shape_class
from ..formats.base import Format
from ..problem import Problem
from ..registry import Registry
from .state import selection_state

__all__ = ["log_choice"]

log = logging.getLogger("quantcore.selection")


def log_choice(registry: Registry, fmt: Format, device: str, problem: Problem | None, kernel: str,
               reason: str, *, how: str = "chose") -> None:
    """INFO on the ``quantcore`` logger, once per (format, device, shape class) and registry."""
    shape = shape_class(problem) if problem is not None else "any shape"
    if selection_state(registry).first_time(("choice", fmt.slug, device, shape, kernel)):
        log.info("%s %s for %s on %s, %s: %s", how, kernel, fmt.slug, device, shape, reason)
