"""The golden min-max quantizer of the pack-quantized format, in plain torch.

Per (output, group): the range is widened to include 0; symmetric scales are
``max|w| / ((2^b − 1) / 2)`` with zero point 0, asymmetric ones ``(max − min) / (2^b − 1)``
with the zero point ``round(−2^(b−1) − min / scale)``; codes are
``clamp(round(w / scale) + z, −2^(b−1), 2^(b−1) − 1)``, chosen against the float16 scale
that is stored. Act-order is simulated as GPTQ's quantizer does: groups formed in a random
column order, so ``weight_g_idx`` is not monotonic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...errors import TensorFormatError
from ...tensors import require_float_weight, require_representable
from ..gptq.quantize import group_min_max, quantizer_groups
from ..packing import pack_codes

if TYPE_CHECKING:
    from .format import CompressedTensors

__all__ = ["quantize_minmax"]


def quantize_minmax(
    fmt: CompressedTensors, weight: torch.Tensor, *, generator: torch.Generator | None = None,
    perm: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    require_float_weight(weight, ndim=2, layout="[O, I]")
    out_features, in_features = weight.shape
    if in_features % fmt.per_lane or out_features % fmt.per_lane:
        raise TensorFormatError(
            f"weight: {fmt.slug} packs {fmt.per_lane} codes per int32; in_features={in_features} and "
            f"out_features={out_features} must both be multiples of {fmt.per_lane}"
        )
    gs = fmt.effective_group_size(in_features)
    groups = fmt.num_groups(in_features)
    w = weight.to(torch.float32)
    g_idx = quantizer_groups(in_features, gs, w.device, act_order=fmt.act_order, perm=perm, generator=generator).long()
    wmin, wmax = group_min_max(w, g_idx, groups)
    lo, hi = -fmt.offset, fmt.offset - 1
    if fmt.sym:
        scale = torch.maximum(wmin.abs(), wmax) / ((hi - lo) / 2)
    else:
        scale = (wmax - wmin) / (hi - lo)
    scale = scale.to(torch.float16).float()
    require_representable(scale, "weight_scale", weight, torch.float16)
    scale = torch.where(scale == 0, torch.finfo(torch.float16).tiny, scale)
    zero = torch.zeros_like(scale) if fmt.sym else torch.round(lo - wmin / scale).clamp(lo, hi)
    q = torch.clamp(torch.round(w / scale[:, g_idx]) + zero[:, g_idx], lo, hi).to(torch.int32)
    out = {
        "weight_packed": pack_codes(q + fmt.offset, fmt.bits, dim=1),
        "weight_scale": scale.to(torch.float16),
        "weight_shape": torch.tensor([out_features, in_features], dtype=torch.int64, device=weight.device),
    }
    if not fmt.sym:
        out["weight_zero_point"] = pack_codes(zero.to(torch.int32) + fmt.offset, fmt.bits, dim=0)
    if fmt.act_order:
        out["weight_g_idx"] = g_idx.to(torch.int32)
    return out
