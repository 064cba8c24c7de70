"""The fields every prepared state of pair-interleaved GPTQ codes holds (each backend's
state extends it and says how its tensors are laid out)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from .layout import block_k, padded_k

__all__ = ["PairedWeights"]


@dataclass(kw_only=True)
class PairedWeights:
    """A linear's prepared state: the codes (``qweight``, in the backend's arrangement of
    the words of :mod:`.layout`), scales, true zero points (None when every one is
    ``2^(b−1)``), the group of each sub-group of ``sub_group`` sorted inputs (None when
    sub-group i is group i), the permutation of x that sorts the inputs by group
    (``ret_idx``, None when they are in order) and the bias."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group_map: torch.Tensor | None
    sub_group: int
    bits: int
    in_features: int
    out_features: int
    ret_idx: torch.Tensor | None
    bias: torch.Tensor | None
    #: Launch-time state (split-K counters, descriptors), filled on first use; not part of the layout.
    runtime: dict[Hashable, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def blocks(self) -> int:
        """Blocks of the padded K."""
        return padded_k(self.in_features, self.bits) // block_k(self.bits)

    def nbytes(self) -> int:
        """Bytes the layout holds (the weight's own; launch-time buffers excluded)."""
        ts = (self.qweight, self.scales, self.zeros, self.group_map, self.ret_idx, self.bias)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)
