"""Shared memory a kernel declares itself, beside the dynamic shared memory Triton sizes.

A kernel may declare a table in inline PTX (``.shared`` at function scope: static shared
memory). CUDA lets a block use more than 48 KB of shared memory only where the function's
maximum dynamic size is raised first (``cuFuncSetAttribute``). Triton raises it only when
its own dynamic size is above 48 KB (to what the card allows beside the static part), so a
kernel with, say, 32 KB of static table and 37 KB of Triton's buffers would fail to launch.
:func:`opt_in` raises the limit to Triton's size for such a kernel, once, before its first
launch; it leaves every other kernel as Triton loaded it.
"""

from __future__ import annotations

import ctypes
from typing import Any

from .cuda_driver import libcuda

__all__ = ["DEFAULT_LIMIT", "opt_in"]

#: What a block may use without the opt-in.
DEFAULT_LIMIT = 48 * 1024
_SHARED_SIZE_BYTES = 1  # CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: the static part
_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_PREFER_SHARED = 1  # CU_FUNC_CACHE_PREFER_SHARED


def opt_in(kernel: Any, driver: Any = None) -> int:
    """Let ``kernel`` (a loaded Triton ``CompiledKernel``) launch with its static and dynamic
    shared memory together above 48 KB; returns the static bytes. Raises ``RuntimeError``
    with the driver's code where the driver refuses (the card has less)."""
    kernel._init_handles()  # loads the binary: its function handle
    lib = driver or libcuda()
    dynamic = int(kernel.metadata.shared)
    static = ctypes.c_int(0)
    function = ctypes.c_void_p(kernel.function)
    rc = lib.cuFuncGetAttribute(ctypes.byref(static), _SHARED_SIZE_BYTES, function)
    if rc != 0:
        raise RuntimeError(f"{kernel.name}: cuFuncGetAttribute(SHARED_SIZE_BYTES) failed with CUDA error {rc}")
    if dynamic > DEFAULT_LIMIT or static.value + dynamic <= DEFAULT_LIMIT:
        return static.value  # Triton raised the limit itself, or none is needed
    rc = lib.cuFuncSetAttribute(function, _MAX_DYNAMIC_SHARED_SIZE_BYTES, ctypes.c_int(dynamic))
    if rc == 0:
        # As Triton does for its own large kernels: the largest shared-memory carve-out, so
        # that as many blocks share an SM as their registers allow (the driver's default
        # carve-out may leave room for one).
        rc = lib.cuFuncSetCacheConfig(function, _PREFER_SHARED)
    if rc != 0:
        raise RuntimeError(f"{kernel.name}: {static.value} bytes of static and {dynamic} of dynamic shared memory "
                           f"a block: the driver refused the opt-in (CUDA error {rc})")
    return static.value
