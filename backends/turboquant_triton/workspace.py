"""Per-device scratch the split-K kernels share: the tickets (int32, zero between launches)
with which the last program of a row chunk learns that every split has stored its partials.

Each launch leaves its tickets at zero again (the last program resets its chunk's), so
one zeroed array serves every launch on a device in stream order; launches that run
concurrently on two streams must not share it. The array is kept per (device, stream)
and only grows, outside any CUDA-graph pool (:mod:`quantcore.triton.buffers`).
"""

from __future__ import annotations

import torch

from quantcore.triton.buffers import KeptBuffers, stream_key

__all__ = ["tickets"]

_TICKETS = KeptBuffers(torch.int32, zero=True, minimum=1024, doubling=True)


def tickets(device: torch.device, count: int) -> torch.Tensor:
    """A zeroed int32 array of at least ``count`` tickets for the current stream of ``device``."""
    return _TICKETS.get(stream_key(device), count, device)
