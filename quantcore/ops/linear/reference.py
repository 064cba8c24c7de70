"""The golden ``linear``: y = x Wᵀ + b in float64."""

from __future__ import annotations

import torch

__all__ = ["linear_reference"]


def linear_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The golden linear in float64: every input is upcast exactly, nothing rounds."""
    y = x.double() @ weight.double().T
    if bias is not None:
        y = y + bias.double()
    return y
