"""Per-device scratch the split-K kernels share: the tickets (int32, zero between launches)
with which the last program of a row chunk learns that every split has stored its partials.

Each launch leaves its tickets at zero again (the last program resets its chunk's), so
one zeroed array serves every launch on a device in stream order; launches that run
concurrently on two streams must not share it (``tickets(device, stream)``). The array
is allocated once per (device, stream) and only grows, outside any CUDA-graph pool
(:mod:`quantcore.workspace`).
"""

from __future__ import annotations

import threading

import torch

from quantcore.workspace import capturing, kept_buffer

__all__ = ["tickets"]

_lock = threading.Lock()
_tickets: dict[tuple[str, int], torch.Tensor] = {}
#: Outgrown arrays stay allocated: a CUDA graph captured earlier may still use them.
_retired: list[torch.Tensor] = []


def tickets(device: torch.device, count: int) -> torch.Tensor:
    """A zeroed int32 array of at least ``count`` tickets for the current stream of ``device``."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    with _lock:
        have = _tickets.get(key)
        if have is None or have.numel() < count:
            if capturing(device):  # this graph's own, not kept (quantcore.workspace)
                return torch.zeros(count, dtype=torch.int32, device=device)
            if have is not None:
                _retired.append(have)
            size = max(count, 1024, 0 if have is None else 2 * have.numel())
            have = _tickets[key] = kept_buffer(size, torch.int32, device, zero=True)
        return have
