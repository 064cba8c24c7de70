"""``linear``: y = x Wᵀ + b, with W ``[N, K]`` (out-features × in-features)."""

from __future__ import annotations

import torch

from .base import Op

__all__ = ["LINEAR", "linear_reference"]

LINEAR = Op(
    name="linear",
    dims=("M", "K", "N"),
    doc="y[M, N] = x[M, K] @ W[N, K]ᵀ + b[N]; W dequantized from the format",
)


def linear_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The golden linear in float64: every input is upcast exactly, nothing rounds."""
    y = x.double() @ weight.double().T
    if bias is not None:
        y = y + bias.double()
    return y
