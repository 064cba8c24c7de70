"""``linear``: y = x Wᵀ + b, with W ``[N, K]`` (out-features × in-features) dequantized from
the format; x is ``[..., K]``, y ``[..., N]`` in x's dtype."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ...errors import KernelInputError
from ...formats.base import Format
from ...tensors import describe
from ..op import Op
from .harness import HARNESS
from .reference import linear_reference

__all__ = ["OP", "linear_reference"]


def _output(fmt: Format, dims: Mapping[str, int], x: torch.Tensor) -> torch.Tensor:
    k = dims.get("K")
    if k is not None and x.shape[-1] != k:
        raise KernelInputError(f"x: expected [..., {k}], got {describe(x)}")
    return x.new_empty((*x.shape[:-1], dims["N"]))


OP = Op(
    name="linear",
    dims=("M", "K", "N"),
    weight_dims=("K", "N"),
    doc="y[M, N] = x[M, K] @ W[N, K]ᵀ + b[N]; W dequantized from the format",
    output=_output,
    harness=HARNESS,
)
