"""The TurboQuant quantizer (docs/formats/turboquant.md, steps 1-5), in plain float torch.

Runs on whatever device the weight is on (a GPU makes ``quantize_model`` fast); the
rotations are drawn on the CPU from the caller's generator and stored, so the result is
what the checkpoint means regardless of where it was computed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ...errors import TensorFormatError
from ...tensors import require_float_weight
from .codebook import codebook_tensor
from .indices import pack_indices
from .rotation import random_rotation

if TYPE_CHECKING:
    from .format import TurboQuant

__all__ = ["nearest_centroid", "quantize_pass", "quantize_weight"]


def nearest_centroid(z: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """Index of the nearest centroid (ascending ``codebook``) for every element of ``z``."""
    boundaries = ((codebook[1:] + codebook[:-1]) / 2).to(z.dtype)
    return torch.bucketize(z, boundaries)


def quantize_pass(
    fmt: TurboQuant, weight: torch.Tensor, rotation: torch.Tensor, codebook: torch.Tensor
) -> dict[str, torch.Tensor]:
    """One pass: per (row, group) norm, rotate the unit slice, round √d·coordinates.

    ``weight`` float32 ``[N, K]``; ``rotation`` float32 ``[R, d, d]`` (stored as given).
    """
    n, k = weight.shape
    d = fmt.group_size
    slices = weight.view(n, k // d, d)
    norms = slices.norm(dim=-1)  # [N, G]
    stored_norms = norms.to(fmt.norm_dtype)
    overflow = ~torch.isfinite(stored_norms)
    if overflow.any():
        row, group = (int(v) for v in torch.nonzero(overflow)[0])
        raise TensorFormatError(
            f"weight: the norm of row {row}, group {group} is {norms[row, group].item():.6g}, "
            f"beyond {fmt.norm_dtype}'s range; quantize with norm_dtype=torch.float32"
        )
    unit = slices / norms.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1)
    if rotation.shape[0] == 1:
        rotated = unit @ rotation[0].T  # y = Π u for every slice
    else:
        rotated = torch.einsum("ngk,gjk->ngj", unit, rotation)
    idx = nearest_centroid((rotated * math.sqrt(d)).contiguous(), codebook.to(weight.device))
    return {
        "indices": pack_indices(idx.reshape(n, k)),
        "norms": stored_norms.contiguous(),
        "rotation": rotation.contiguous(),
    }


def quantize_weight(
    fmt: TurboQuant, weight: torch.Tensor, *, generator: torch.Generator | None = None
) -> dict[str, torch.Tensor]:
    """Dense float ``W [N, K]`` → the format's tensors (both passes when ``residual``)."""
    require_float_weight(weight, ndim=2, layout="[N, K]")
    n, k = weight.shape
    d = fmt.group_size
    if n == 0 or k == 0 or k % d:
        raise TensorFormatError(
            f"weight: {fmt.slug} needs in_features (got {k}) to be a positive multiple of "
            f"group_size = {d}, and out_features > 0 (got {n})"
        )
    device = weight.device
    w = weight.to(torch.float32)
    codebook = codebook_tensor(fmt.bits).to(device)
    out: dict[str, torch.Tensor] = {"codebook": codebook}
    count = fmt.num_rotations(k)
    for prefix in fmt.passes:
        rotation = random_rotation(d, count, generator=generator).to(device, torch.float32)
        tensors = quantize_pass(fmt, w, rotation, codebook)
        out.update({prefix + name: t for name, t in tensors.items()})
        if prefix == "" and fmt.residual:
            # Pass 2 encodes exactly what the stored pass 1 leaves (its rounded norms too).
            w = w - fmt.dequantize_pass(out, "", codebook, torch.float32)
    return out

