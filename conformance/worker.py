"""How a worker process of the matrix sets itself up: one thread for every math library,
and large tensors in huge pages.

The matrix on a CPU runs many small calls in each worker, one worker per CPU, so a
library's own thread pool only competes with the other workers. Two costs measured on the
CI machine's 2 cores (docs/conformance.md):

- NumPy's OpenBLAS, which Triton's interpreter calls for every ``tl.dot``, keeps a thread
  per CPU spinning between calls: CPU time with no work done (42 % of the
  ``trtllm_moe_triton`` cells' CPU time, 18 % of ``turboquant_triton``'s).
- Every large tensor (a golden quantization's temporaries, a ``prepare``'s copies:
  gigabytes for a 4096 × 11008 weight) is fresh memory from the system, faulted in and
  zeroed 4 KiB at a time: 120 of the matrix's 326 CPU-seconds were system time. torch
  puts tensors of 2 MiB and more in transparent huge pages when ``THP_MEM_ALLOC_ENABLE``
  is set before the process's first CPU allocation, which the matrix's parent has not
  made when it forks its workers: a fault per 2 MiB instead of 512.

Both settings are this process's alone. The verdicts are the same; the interpreter's fp32
``tl.dot`` sums in another order on one BLAS thread, so a few interpreter cells report an
error a few per cent apart in its last bits. Each is skipped where it cannot apply
(another BLAS; a process that allocated before; a kernel without huge pages).
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["huge_pages_for_tensors", "one_blas_thread", "set_up_worker"]

#: torch's switch (read once, at the process's first CPU allocation).
THP_VARIABLE = "THP_MEM_ALLOC_ENABLE"
#: OpenBLAS's setter as NumPy's wheels export it (plain, 64-bit interface, SciPy's build).
_OPENBLAS_SETTERS = ("openblas_set_num_threads", "openblas_set_num_threads64_", "scipy_openblas_set_num_threads64_")
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def set_up_worker(threads: int) -> None:
    """What a forked worker runs before its first cell. Threads first: a pool the parent
    started is not usable in a forked child, so nothing here may need one."""
    import torch

    torch.set_num_threads(threads)
    one_blas_thread(threads)
    huge_pages_for_tensors()


def huge_pages_for_tensors() -> bool:
    """Ask torch to put large CPU tensors in transparent huge pages (unless the user set
    ``THP_MEM_ALLOC_ENABLE``); whether the kernel offers them to a process that asks. It
    takes effect only in a process that has not yet allocated a CPU tensor (a worker
    forked before any cell ran), and allocates nothing itself."""
    os.environ.setdefault(THP_VARIABLE, "1")
    try:
        with open(_THP_MODE) as mode:
            return "[never]" not in mode.read()
    except OSError:  # not Linux, or a kernel without them
        return False


def one_blas_thread(threads: int = 1) -> bool:
    """Limit the OpenBLAS that NumPy loaded to ``threads``; False where there is none."""
    done = False
    for path in _loaded_libraries("openblas"):
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _OPENBLAS_SETTERS:
            setter = getattr(library, name, None)
            if setter is not None:
                setter(threads)
                done = True
                break
    return done


def _loaded_libraries(part: str) -> list[str]:
    """Paths of the shared libraries mapped into this process whose file name holds ``part``."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if ".so" in line}
    except OSError:  # not Linux
        return []
    return sorted(p for p in paths if part in p.rsplit("/", 1)[-1].lower())
