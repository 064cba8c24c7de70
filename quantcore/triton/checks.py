"""The per-call activation check of a launcher: what
:func:`quantcore.tensors.check_activation` checks, with its message built only when the
check fails (the happy path costs a few attribute reads). No triton import."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..tensors import check_activation

__all__ = ["check_x"]


def check_x(x: Any, k: int, dtypes: Sequence[torch.dtype], device: torch.device, name: str = "x") -> None:
    """``x`` is a ``[..., k]`` tensor of one of ``dtypes`` on ``device``, else
    :class:`~quantcore.errors.KernelInputError` naming what came."""
    if not (isinstance(x, torch.Tensor) and x.dim() and x.shape[-1] == k and x.dtype in dtypes
            and x.device == device):
        check_activation(x, k=k, dtypes=dtypes, device=device, name=name)
