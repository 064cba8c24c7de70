"""Triton's interpreter runs one launch at a time in a process.

The interpreter (``TRITON_INTERPRET=1``, triton 3.6) keeps a launch's state in module
globals: each launch patches the functions of ``triton.language`` in place for its
kernel and restores them when it ends, and one shared builder holds the grid index that
``tl.program_id`` reads. Two threads launching at once therefore corrupt each other: one
restores ``triton.language`` while the other still runs (``Did you forget to add
@triton.jit?``), or reads the other's program id (a silently wrong tile).
:func:`serialize_launches` wraps the interpreter's launch in one process-wide lock;
compiled launches (a GPU) are untouched. Every module that defines Triton kernels calls
it when it imports triton.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

__all__ = ["serialize_launches"]

_lock = threading.RLock()


def serialize_launches() -> None:
    """Make interpreted launches take turns (idempotent; nothing when not interpreting)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    executor = interpreter.GridExecutor
    launch = executor.__call__
    if getattr(launch, "_quantcore_serialized", False):
        return

    @functools.wraps(launch)
    def serialized(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _lock:
            return launch(self, *args, **kwargs)

    serialized._quantcore_serialized = True  # type: ignore[attr-defined]
    executor.__call__ = serialized
