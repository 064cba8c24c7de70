"""The golden group-wise quantizer of the trtllm_moe format, in plain torch.

Symmetric: TensorRT-LLM's ``symmetric_quantize`` rule (cutlass_preprocessors.cpp) applied
per (expert, group, column) instead of per column: ``scale = amax / 128``,
``q = clamp(round(w / scale), −128, 127)``, and a zero scale gives q = 0.

Asymmetric: the group's range is mapped onto the 256 codes: ``scale = (max − min) / 255``,
``zero = min + 128 · scale``, ``q = clamp(round((w − zero) / scale), −128, 127)``, so
``q · scale + zero`` spans [min, max].

Codes are chosen against the scale and zero as stored (rounded to ``scale_dtype``), so
the checkpoint's dequantization is the best this rule can do with what it holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...tensors import require_float_weight, require_representable

if TYPE_CHECKING:
    from .format import TRTLLMMoE

__all__ = ["quantize_groupwise"]


def _group_view(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[E, K, N]`` → ``[E, G, group_size, N]``, padding a partial last group by
    repeating its last row (which changes neither its min nor its max)."""
    e, k, n = w.shape
    pad = -k % group_size
    if pad:
        w = torch.cat([w, w[:, -1:, :].expand(e, pad, n)], dim=1)
    return w.view(e, -1, group_size, n)


def quantize_groupwise(fmt: TRTLLMMoE, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    require_float_weight(weight, ndim=3, layout="[E, K, N]")
    k = weight.shape[1]
    # One expert at a time keeps the float32 temporaries to one expert's size.
    parts = [_quantize_expert(fmt, weight[e : e + 1].float(), k) for e in range(weight.shape[0])]
    out = {name: torch.cat([p[name] for p in parts]) for name in parts[0]}
    return out


def _quantize_expert(fmt: TRTLLMMoE, w: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    groups = _group_view(w, fmt.group_size)
    tiny = torch.finfo(fmt.scale_dtype).tiny
    if fmt.sym:
        amax = groups.abs().amax(dim=2)
        scale = (amax / 128).to(fmt.scale_dtype).float()
        zero = torch.zeros_like(scale)
    else:
        lo, hi = groups.amin(dim=2), groups.amax(dim=2)
        scale = ((hi - lo) / 255).to(fmt.scale_dtype).float()
        zero = (lo + 128 * scale).to(fmt.scale_dtype).float()
    require_representable(scale, "scales", w, fmt.scale_dtype)
    require_representable(zero, "zeros", w, fmt.scale_dtype)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale)).clamp_min(tiny)
    q = torch.round((w - fmt.expand_groups(zero, k)) / fmt.expand_groups(safe, k))
    q = torch.where(fmt.expand_groups(scale, k) > 0, q, torch.zeros_like(q))
    out = {
        "qweight": q.clamp(-128, 127).to(torch.int8).contiguous(),
        "scales": scale.to(fmt.scale_dtype).contiguous(),
    }
    if not fmt.sym:
        out["zeros"] = zero.to(fmt.scale_dtype).contiguous()
    return out
