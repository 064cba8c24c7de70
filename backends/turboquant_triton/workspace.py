"""Per-device scratch the split-K kernels share: the float32 workspace in which each split
stores its partials, and the tickets (int32, zero between launches) with which the last
program of a row chunk learns that every split has stored them.

Each launch leaves its tickets at zero again (the last program resets its chunk's) and
reads back only the partials it stored, so one pair of arrays serves every launch on a
device in stream order, with no allocation a call; launches that run concurrently on two
streams must not share them. The arrays are kept per (device, stream) and only grow,
outside any CUDA-graph pool (:mod:`quantcore.triton.buffers`).
"""

from __future__ import annotations

import torch

from quantcore.triton.buffers import KeptBuffers, stream_key

__all__ = ["split_k_buffers"]

_PARTIALS = KeptBuffers(torch.float32, zero=False, minimum=1 << 16, doubling=True)
_TICKETS = KeptBuffers(torch.int32, zero=True, minimum=1024, doubling=True)


def split_k_buffers(device: torch.device, partials: int, tickets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """At least ``partials`` float32 workspace elements and ``tickets`` zeroed int32
    tickets for the current stream of ``device``."""
    key = stream_key(device)
    return _PARTIALS.get(key, partials, device), _TICKETS.get(key, tickets, device)
