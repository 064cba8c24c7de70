"""Tensors a launch state keeps without keeping the tensor it is kept for.

A launch state (:func:`.launch.launch_state`) lives as long as its owner, a weight's
tensor, and is dropped by a weak reference's callback when the owner dies. Anything in
it that refers to the owner keeps the owner alive, and with it the state: the weight
would stay in memory for the life of the process. A view refers to its base (``_base``),
so a view of the owner does too, as does a tensor descriptor built on one.

So a bucket remembers the owner by weak reference (its ``fits`` compares ``ref() is
tensor``), and binds the owner, or a view of it, for launching as :func:`unowned`: a
tensor over the same memory (storage, offset, shape, strides, dtype) that refers to the
storage alone — as are the bases of the tensor descriptors it keeps. The storage then
lives as long as the state does. The weight's other tensors it may hold as they are: they
do not refer to the owner. No triton import.
"""

from __future__ import annotations

import torch

__all__ = ["unowned"]


def unowned(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s memory that refers to its storage, not to ``t`` (no ``_base``)."""
    alias = torch.empty(0, dtype=t.dtype, device=t.device)
    return alias.set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())

