"""The golden ``moe`` in float64: the routed GEMM and the gated FFN built from two of them
(the contract is in :mod:`quantcore.ops.moe`)."""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["ExpertsLike", "moe_ffn_reference", "moe_gemm_reference", "swiglu"]


class ExpertsLike(Protocol):
    """Expert weights indexable by expert id: ``weight[e]`` is a dense ``[K, N]``."""

    def __getitem__(self, e: int) -> torch.Tensor: ...


def _route_rows(x: torch.Tensor, topk: int) -> torch.Tensor:
    """The activation row of every route, ``[T · topk, K]``."""
    if x.dim() == 2:
        return x.repeat_interleave(topk, dim=0)
    return x.reshape(-1, x.shape[-1])


def moe_gemm_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    weight: ExpertsLike,
    topk_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """The golden routed GEMM in float64. ``weight`` is the dense ``[E, K, N]``, or
    anything whose ``weight[e]`` is expert e's dense ``[K, N]`` (so large golden
    weights can be materialised one expert at a time)."""
    t, topk = topk_ids.shape
    rows = _route_rows(x.double(), topk)
    ids = topk_ids.reshape(-1).long()
    parts: dict[int, torch.Tensor] = {}
    for e in torch.unique(ids).tolist():
        parts[e] = rows[ids == e] @ weight[e].to(device=rows.device, dtype=torch.float64)
    n = next(iter(parts.values())).shape[1]
    y = torch.empty(rows.shape[0], n, dtype=torch.float64, device=rows.device)
    for e, part in parts.items():
        y[ids == e] = part
    y = y.view(t, topk, n)
    if topk_weights is None:
        return y
    return (y * topk_weights.double().unsqueeze(-1)).sum(dim=1)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """TensorRT-LLM's SwiGLU on ``[..., 2·I]``: linear half first, gate half second."""
    inter = h.shape[-1] // 2
    return h[..., :inter] * torch.nn.functional.silu(h[..., inter:])


def moe_ffn_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w1: ExpertsLike,
    w2: ExpertsLike,
) -> torch.Tensor:
    """The golden gated FFN in float64 (no rounding between the stages)."""
    h = moe_gemm_reference(x, topk_ids, w1)
    return moe_gemm_reference(swiglu(h), topk_ids, w2, topk_weights)
