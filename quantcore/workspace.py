"""Scratch that kernels keep between calls (split-K tickets, dequantization buffers), safe
under CUDA graphs.

A cache filled while ``torch.compile(mode="reduce-overhead")`` warms up or records a graph
would otherwise take its memory from the graph's private pool and outlive the call, which
cudagraph trees refuse ("tensor(s) in the cudagraph pool not tracked as outputs"). Those
trees route into their pool only what is allocated on their own stream, so a kept buffer
is allocated on a side stream here; while a stream is being captured, a buffer the cache
lacks is made for that graph alone (:func:`capturing`: the caller must not keep it).
"""

from __future__ import annotations

import torch

__all__ = ["capturing", "kept_buffer"]

_side: dict[torch.device, torch.cuda.Stream] = {}


def capturing(device: torch.device) -> bool:
    """Whether the current stream of ``device`` is recording a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def kept_buffer(numel: int, dtype: torch.dtype, device: torch.device, *, zero: bool) -> torch.Tensor:
    """A buffer for a cache to keep: on a CUDA device, from the caching allocator's default
    pool even inside a CUDA-graph memory pool; zeroed when ``zero``."""
    make = torch.zeros if zero else torch.empty
    if device.type != "cuda" or capturing(device):
        return make(numel, dtype=dtype, device=device)
    side = _side.get(device)
    if side is None:
        side = _side[device] = torch.cuda.Stream(device)
    current = torch.cuda.current_stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        buf = make(numel, dtype=dtype, device=device)
    current.wait_stream(side)  # zeroed before the caller's kernels read it
    return buf
