"""What group-wise formats (GPTQ, AWQ) share: a ``group_size`` (−1 for one group over
all inputs) that must divide the in-features, and the checks every stored linear needs
whatever its packing: bias shape, one device, finite scales."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from ..errors import TensorFormatError
from ..tensors import require_tensor

__all__ = ["SCALE_DTYPES", "GroupedFormat", "check_linear_extras"]

SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class GroupedFormat:
    """Mixin for frozen format dataclasses with ``group_size`` and ``slug``."""

    group_size: int
    name: ClassVar[str]

    def _check_group_size(self) -> None:
        gs = self.group_size
        if not (gs == -1 or (isinstance(gs, int) and not isinstance(gs, bool) and gs > 0)):
            raise TensorFormatError(f"{self.name} group_size: expected a positive int or -1, got {gs!r}")

    def effective_group_size(self, in_features: int) -> int:
        return in_features if self.group_size == -1 else self.group_size

    def num_groups(self, in_features: int) -> int:
        gs = self.effective_group_size(in_features)
        if in_features % gs:
            raise TensorFormatError(
                f"{self.slug}: group_size={self.group_size} does not divide in_features={in_features}"  # type: ignore[attr-defined]
            )
        return in_features // gs


def check_linear_extras(tensors: Mapping[str, torch.Tensor], out_features: int, where: str) -> None:
    """Optional bias ``[O]``, every tensor on one device, finite scales."""
    bias = tensors.get("bias")
    if bias is not None:
        require_tensor("bias", bias, shape=(out_features,), dtypes=SCALE_DTYPES, where=where)
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        raise TensorFormatError(f"{where}: tensors on several devices {sorted(map(str, devices))}")
    if not torch.isfinite(tensors["scales"]).all():
        raise TensorFormatError(f"{where}: scales: contains NaN or Inf")
