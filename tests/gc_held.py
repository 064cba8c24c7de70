"""Counting what a call runs (cProfile) without the garbage collector's share: a
collection may run the finalizers of other tests' objects inside the call counted."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_held() -> Iterator[None]:
    """Collect now, then hold collections off until the block ends."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
