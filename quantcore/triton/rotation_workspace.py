"""The kept buffers of a launch that rotates a TurboQuant layer's x inside itself: the
rotated x (in the rotation's dtype) that its rotation programs store and its other
programs read, and the two counts (int32, zero between launches) that join them
(``backends/turboquant_triton/mma.py``'s ``ROTATE_ONCE``,
``backends/hopper_wgmma/rotation_programs.py``).

Both are written and read within one launch, whose last program sets the counts to 0
again, so one pair per (device, stream) serves every such launch there, of any backend,
in stream order; launches that run concurrently on two streams must not share them. They
only grow, outside any CUDA-graph pool (:mod:`.buffers`). No triton import.
"""

from __future__ import annotations

import torch

from .buffers import KeptBuffers, stream_key

__all__ = ["rotation_buffers"]

#: By (device, stream, dtype): the rotated x of one call, in the rotation's dtype.
_ROTATED = KeptBuffers(None, zero=False, minimum=1 << 16, doubling=True)
_COUNTS = KeptBuffers(torch.int32, zero=True, minimum=32)


def rotation_buffers(device: torch.device, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """At least ``numel`` elements of ``dtype`` for the rotated x and the two zeroed int32
    counts for the current stream of ``device``."""
    key = stream_key(device)
    return _ROTATED.get((*key, dtype), numel, device, dtype), _COUNTS.get(key, 2, device)
