"""AWQ's round-to-nearest quantizer (AutoAWQ ``pseudo_quantize_tensor``), in plain torch.

The activation-aware part of AWQ (searching per-channel scales and folding them into the
previous layer) changes the weights, not the storage, so the golden quantizer is the
rounding rule alone. Codes are chosen against the fp16 scales that are stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...errors import TensorFormatError
from ...tensors import require_float_weight, require_representable
from .order import pack_awq

if TYPE_CHECKING:
    from .format import AWQ

__all__ = ["quantize_awq"]


def quantize_awq(fmt: AWQ, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    require_float_weight(weight, ndim=2, layout="[O, I]")
    out_features, in_features = weight.shape
    if out_features % 8:
        raise TensorFormatError(f"weight: awq packs 8 outputs per lane; out_features={out_features} is not a multiple of 8")
    groups = fmt.num_groups(in_features)
    w = weight.to(torch.float32).reshape(out_features, groups, -1)  # [O, G, gs]
    maxq = fmt.maxq
    if fmt.zero_point:
        wmax, wmin = w.amax(-1), w.amin(-1)
        scale = ((wmax - wmin).clamp_min(1e-5) / maxq).to(torch.float16).float()
        zero = torch.clamp(-torch.round(wmin / scale), 0, maxq)
    else:
        half = 1 << (fmt.bits - 1)
        scale = (w.abs().amax(-1).clamp_min(1e-5) / (half - 1)).to(torch.float16).float()
        zero = torch.full_like(scale, half)
    require_representable(scale, "scales", weight, torch.float16)
    q = torch.clamp(torch.round(w / scale.unsqueeze(-1)) + zero.unsqueeze(-1), 0, maxq)
    q = q.reshape(out_features, in_features).to(torch.int32)
    return {
        "qweight": pack_awq(q.T.contiguous()),
        "qzeros": pack_awq(zero.to(torch.int32).T.contiguous()),
        "scales": scale.T.to(torch.float16).contiguous(),
    }
