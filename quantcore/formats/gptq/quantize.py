"""GPTQ's round-to-nearest quantizer (the ``Quantizer.find_params`` rule), in plain torch.

This is the golden quantizer, not the GPTQ algorithm: no Hessian, no error feedback.
It produces checkpoints with exactly GPTQ's storage semantics, which is what the
conformance matrix needs. Act-order is simulated with a random column order standing in
for the Hessian's: groups are formed in that order, so ``g_idx`` is not monotonic.
With ``static_groups`` the groups are formed on the original column order whatever the
processing order, so ``g_idx`` stays ``i // group_size``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...errors import TensorFormatError
from ...tensors import require_float_weight, require_representable
from ..packing import pack_codes
from .convert import zero_to_stored

if TYPE_CHECKING:
    from .format import GPTQ

__all__ = ["act_order_g_idx", "group_min_max", "quantize_rtn", "quantizer_groups"]


def act_order_g_idx(perm: torch.Tensor, group_size: int) -> torch.Tensor:
    """g_idx when columns are quantized in the order ``perm`` (``desc_act``):
    column ``perm[j]`` is the j-th processed, so it lands in group ``j // group_size``."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return (inv // group_size).to(torch.int32)


def quantizer_groups(in_features: int, group_size: int, device: torch.device, *, act_order: bool,
                     perm: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """``g_idx`` (int32) as a golden quantizer forms its groups: ``i // group_size``, or with
    ``act_order`` in the column order ``perm`` (a random one drawn unless given), so that
    ``g_idx`` is not monotonic."""
    if act_order:
        if perm is None:
            perm = torch.randperm(in_features, generator=generator, device="cpu").to(device)
        return act_order_g_idx(perm, group_size).to(device)
    return (torch.arange(in_features, device=device) // group_size).to(torch.int32)


def group_min_max(w: torch.Tensor, g_idx: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (output row, group) minimum and maximum of ``w`` ``[O, I]``, each range widened
    to include 0."""
    index = g_idx.long().expand(w.shape[0], -1)
    zeros = torch.zeros(w.shape[0], groups, device=w.device)
    return (zeros.scatter_reduce(1, index, w, "amin", include_self=True),
            zeros.scatter_reduce(1, index, w, "amax", include_self=True))


def quantize_rtn(
    fmt: GPTQ,
    weight: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    perm: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    require_float_weight(weight, ndim=2, layout="[O, I]")
    out_features, in_features = weight.shape
    per = fmt.geometry.codes
    if in_features % per or out_features % per:
        raise TensorFormatError(
            f"weight: {fmt.slug} packs codes in runs of {per}; in_features={in_features} and "
            f"out_features={out_features} must both be multiples of {per}"
        )
    gs = fmt.effective_group_size(in_features)
    groups = fmt.num_groups(in_features)
    w = weight.to(torch.float32)
    g_idx = quantizer_groups(in_features, gs, w.device, act_order=fmt.uses_act_order, perm=perm, generator=generator)
    wmin, wmax = group_min_max(w, g_idx, groups)  # pinned to include 0, as GPTQ does
    if fmt.sym:
        wmax = torch.maximum(wmin.abs(), wmax)
        wmin = torch.where(wmin < 0, -wmax, wmin)
    empty = (wmin == 0) & (wmax == 0)
    wmin = torch.where(empty, -1.0, wmin)
    wmax = torch.where(empty, 1.0, wmax)

    maxq = fmt.maxq
    # Codes are chosen against the fp16 scale that is stored, so dequantization of the
    # checkpoint is the best this rule can do with what the file holds.
    scale = ((wmax - wmin) / maxq).to(torch.float16).float()
    require_representable(scale, "scales", weight, torch.float16)
    scale = scale.clamp_min(torch.finfo(torch.float16).tiny)
    if fmt.sym:
        zero = torch.full_like(scale, (maxq + 1) // 2)
    else:
        zero = torch.round(-wmin / scale).clamp(0, maxq)

    gi = g_idx.long()
    q = torch.clamp(torch.round(w / scale[:, gi]) + zero[:, gi], 0, maxq).to(torch.int32)  # [O, I]

    zero_i = zero.to(torch.int32).T.contiguous()  # [G, O]
    stored_zero = zero_to_stored(zero_i, fmt)
    return {
        "qweight": pack_codes(q.T, fmt.bits, dim=0, lane_dtype=fmt.pack_dtype),
        "qzeros": pack_codes(stored_zero, fmt.bits, dim=1, lane_dtype=fmt.pack_dtype),
        "scales": scale.T.to(torch.float16).contiguous(),
        "g_idx": g_idx.to(torch.int32),
    }
