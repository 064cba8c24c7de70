"""MoE modules: a quantized expert-weight set (the routed GEMM, ``quantcore::moe`` when
traced) and the gated FFN built from two of them (:mod:`quantcore.ops.moe`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ..custom_ops import traced
from ..errors import InvalidArgumentError
from ..formats.base import Format
from ..ops.moe import swiglu
from .quant_module import QuantModule

__all__ = ["QuantExperts", "QuantMoE"]


class QuantExperts(QuantModule):
    """Expert weights ``W [E, K, N]`` in a MoE format; ``forward(x, topk_ids, topk_weights=None)``
    is the routed GEMM: ``[T, topk, N]``, or their weighted sum ``[T, N]``.
    ``dtype`` is the activation dtype (float16 or bfloat16 for ``trtllm_moe``)."""

    op_kind = "moe"

    def __init__(
        self,
        fmt: Format,
        tensors: Mapping[str, torch.Tensor] | None = None,
        *,
        num_experts: int | None = None,
        in_features: int | None = None,
        out_features: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.bfloat16,
        prefer: str | Sequence[str] | None = None,
        keep_source: bool = False,
    ) -> None:
        if tensors is None and (num_experts is None or in_features is None or out_features is None):
            raise InvalidArgumentError("QuantExperts: give the tensors, or num_experts, in_features and out_features")
        dims = None if tensors is not None else {"E": num_experts, "K": in_features, "N": out_features}
        super().__init__(fmt, tensors, dims=dims, device=device, dtype=dtype, prefer=prefer,  # type: ignore[arg-type]
                         keep_source=keep_source)

    def forward(
        self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        # QuantModule.forward with this signature: the direct route, else every check.
        kernel = self._direct
        if kernel is not None and not traced(x):
            return kernel(x, topk_ids, self.prepared, topk_weights=topk_weights)  # type: ignore[no-any-return]
        return self._forward_checked((x, topk_ids), {"topk_weights": topk_weights})  # type: ignore[no-any-return]


class QuantMoE(nn.Module):
    """TensorRT-LLM's gated MoE FFN: ``w2(swiglu(w1(x)), topk_weights)`` per route, with
    ``w1 [E, K, 2·I]`` (linear half first, gate second) and ``w2 [E, I, K]``."""

    def __init__(self, w1: QuantExperts, w2: QuantExperts) -> None:
        super().__init__()
        if w1.dims["N"] != 2 * w2.dims["K"] or w1.dims["E"] != w2.dims["E"]:
            raise InvalidArgumentError(
                f"QuantMoE: w1 {w1.dims} and w2 {w2.dims} do not chain (w1's N must be 2 × w2's K, same E)"
            )
        self.w1, self.w2 = w1, w2

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        h = self.w1(x, topk_ids)
        a = swiglu(h.float()).to(x.dtype)  # in float32, rounded once, as TensorRT-LLM's gated activation
        return self.w2(a, topk_ids, topk_weights)  # type: ignore[no-any-return]
