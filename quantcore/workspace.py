"""Scratch that kernels keep between calls (split-K tickets, dequantization buffers), safe
under CUDA graphs.

A cache filled while ``torch.compile(mode="reduce-overhead")`` warms up or records a graph
would otherwise take its memory from the graph's private pool and outlive the call, which
cudagraph trees refuse ("tensor(s) in the cudagraph pool not tracked as outputs"). The
trees route into their pool what the *thread* that runs the model allocates
(``_cuda_beginAllocateCurrentThreadToPool``), so a kept buffer is allocated by a short-lived
helper thread, from the caching allocator's default pool. While a stream is being
captured, a buffer the cache lacks is made for that graph alone (:func:`capturing`: the
caller must not keep it).
"""

from __future__ import annotations

import threading

import torch

__all__ = ["capturing", "kept_buffer"]


def capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is recording a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def kept_buffer(numel: int, dtype: torch.dtype, device: torch.device, *, zero: bool) -> torch.Tensor:
    """A buffer for a cache to keep: on a CUDA device, from the caching allocator's default
    pool even while cudagraph trees route this thread into theirs; zeroed when ``zero``."""
    make = torch.zeros if zero else torch.empty
    if device.type != "cuda" or capturing(device):
        return make(numel, dtype=dtype, device=device)
    made: list[torch.Tensor] = []

    def allocate() -> None:
        with torch.cuda.device(device):
            made.append(make(numel, dtype=dtype, device=device))
            torch.cuda.synchronize(device)  # zeroed before any stream of the caller reads it

    helper = threading.Thread(target=allocate, name="quantcore-workspace")
    helper.start()
    helper.join()
    if not made:
        raise RuntimeError(f"quantcore.workspace: allocating {numel} {dtype} on {device} failed (see the thread's error)")
    return made[0]
