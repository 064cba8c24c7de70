"""Per-device scratch the TurboQuant Triton kernels share, kept per (device, stream) so that
no call allocates it:

* the split-K kernels' float32 workspace, in which each split stores its partials, and
  their tickets (int32, zero between launches), with which the last program of a row
  chunk learns that every split has stored them;
* the tensor-core kernel's rotated x when it rotates x once per call itself
  (``mma.py``, ``ROTATE_ONCE``), and the two counts that join its rotation programs and
  its output tiles: ``quantcore/triton/rotation_workspace.py``'s, shared with the other
  backends that rotate x in their launch.

Each launch leaves its tickets and counts at zero again (its last program resets them)
and reads back only what it stored, so one set of arrays serves every launch on a device
in stream order; launches that run concurrently on two streams must not share them. The
arrays only grow, outside any CUDA-graph pool (:mod:`quantcore.triton.buffers`).
"""

from __future__ import annotations

import torch

from quantcore.triton.buffers import KeptBuffers, stream_key
from quantcore.triton.rotation_workspace import rotation_buffers

__all__ = ["rotation_buffers", "split_k_buffers"]

_PARTIALS = KeptBuffers(torch.float32, zero=False, minimum=1 << 16, doubling=True)
_TICKETS = KeptBuffers(torch.int32, zero=True, minimum=1024, doubling=True)


def split_k_buffers(device: torch.device, partials: int, tickets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """At least ``partials`` float32 workspace elements and ``tickets`` zeroed int32
    tickets for the current stream of ``device``."""
    key = stream_key(device)
    return _PARTIALS.get(key, partials, device), _TICKETS.get(key, tickets, device)

