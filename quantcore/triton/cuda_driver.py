"""The CUDA driver library (``libcuda``) through ctypes, loaded once, for the few driver
calls Triton and torch do not expose (a function's shared-memory attributes, a stream's
capture id). No triton import."""

from __future__ import annotations

import ctypes
import functools

__all__ = ["libcuda"]


@functools.cache
def libcuda() -> ctypes.CDLL:
    """``libcuda.so.1``; raises ``OSError`` where there is no CUDA driver."""
    return ctypes.CDLL("libcuda.so.1")
