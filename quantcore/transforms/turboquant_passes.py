"""One TurboQuant pass (``indices``, ``norms``, ``rotation``) → a kernel's :class:`PassData`
(what :class:`quantcore.nn.turboquant.TurboQuantLinearKernel` runs a pass on).

* ``scales = norms / √d`` in float32: the per-(row, group) factor every kernel applies;
* ``rotation`` becomes the right-hand side of the input GEMM, ``P_g = Π_gᵀ``, so that
  ``x_rot_g = x_g @ P_g``;
* with ``split_halves`` the columns of ``P_g`` are reordered to the even coordinates of
  the group followed by its odd ones. Byte j of a row holds coordinates 2j (low nibble)
  and 2j+1 (high nibble); in the reordered activation those sit at j and d/2 + j, so a
  fused kernel multiplies the low nibbles of d/2 consecutive bytes with one contiguous
  half of the group and the high nibbles with the other — no interleaving in registers.

Nothing is lost for the float32 rotation; ``norms`` come back bit for bit when they were
stored in float16 or bfloat16 (``scales`` carry 24 bits), so the inverse rebuilds those
checkpoints exactly; float32 norms come back within one rounding. ``apply`` validates the
pass on its own (:meth:`TurboQuant.validate_pass`), since it may be handed one pass.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..formats.turboquant.format import TurboQuant
from ..tensors import ieee_div, laid_out
from ..transform import Transform

__all__ = ["PassData", "TurboQuantPassTransform", "split_halves_order"]


@dataclass(frozen=True)
class PassData:
    """One pass in a kernel's layout. Every field is a tensor, so a pass can be moved,
    pinned or viewed from a scratch buffer field by field (``dataclasses.fields``)."""

    indices: torch.Tensor  # [N, K/2] uint8, as stored
    scales: torch.Tensor  # [N, G] float32: norms / √d
    rotation: torch.Tensor  # [R, d, d] in the compute dtype: x_rot_g = x_g @ rotation[r]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def map(self, fn: Any) -> PassData:
        """A PassData with ``fn`` applied to every tensor."""
        return PassData(**{name: fn(t) for name, t in self.tensors().items()})

    def map_named(self, fn: Any) -> PassData:
        """A PassData with ``fn(name, tensor)`` applied to every tensor."""
        return PassData(**{name: fn(name, t) for name, t in self.tensors().items()})


def split_halves_order(d: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[0, 2, 4, …, d−2, 1, 3, …, d−1]``: where each rotated coordinate goes."""
    return torch.cat((torch.arange(0, d, 2, device=device), torch.arange(1, d, 2, device=device)))


class TurboQuantPassTransform(Transform[Mapping[str, torch.Tensor], PassData]):
    name = "turboquant-pass"

    def __init__(self, fmt: TurboQuant, *, split_halves: bool) -> None:
        self.fmt = fmt
        self.split_halves = split_halves

    def apply(self, src: Mapping[str, torch.Tensor]) -> PassData:
        self.fmt.validate_pass(src)
        d = self.fmt.group_size
        rhs = src["rotation"].to(torch.float32).transpose(-1, -2)  # P_g = Π_gᵀ
        if self.split_halves:
            rhs = rhs[:, :, split_halves_order(d, rhs.device)]
        return PassData(
            indices=laid_out(src["indices"]),
            scales=ieee_div(src["norms"].to(torch.float32), math.sqrt(d)).contiguous(),
            rotation=rhs.contiguous(),
        )

    def invert(self, dst: PassData) -> dict[str, torch.Tensor]:
        d = self.fmt.group_size
        rhs = dst.rotation.to(torch.float32)
        if self.split_halves:
            order = split_halves_order(d, rhs.device)
            unsplit = torch.empty_like(rhs)
            unsplit[:, :, order] = rhs
            rhs = unsplit
        return {
            "indices": dst.indices,
            "norms": (dst.scales * math.sqrt(d)).to(self.fmt.norm_dtype),
            "rotation": rhs.transpose(-1, -2).contiguous(),
        }
