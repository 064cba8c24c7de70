"""``trtllm_moe_torch``: the routed GEMM in plain PyTorch, on any device.

Tokens are sorted by expert; each touched expert's weight is dequantized from its
int8 codes (here, independently of the format's golden code) and multiplied in
float32, and the result is rounded to the activation dtype once at the end. It is
slow and exact; it keeps ``get_kernel`` answering where no GPU kernel runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from quantcore.cost import Cost
from quantcore.kernel import Requirements
from quantcore.kernels.trtllm_moe import ACT_DTYPES, TRTLLMMoEKernel
from quantcore.kernels.trtllm_moe.cost import moe_bytes, moe_flops, touched_experts
from quantcore.ops.moe import check_routing
from quantcore.probe import Capabilities
from quantcore.problem import Problem
from quantcore.schema import Fields

from .weights import ExpertWeights, expert_schema, load_expert_weights

__all__ = ["TorchMoE"]


def dequantize_expert(w: ExpertWeights, e: int) -> torch.Tensor:
    """Expert ``e`` as float32 ``[K, N]``: ``q · scale (+ zero)`` per group of K rows."""
    def rows(t: torch.Tensor) -> torch.Tensor:
        return t[e].float().repeat_interleave(w.group_size, dim=0)[: w.k]

    dense = w.qweight[e].float() * rows(w.scales)
    return dense + rows(w.zeros) if w.zeros is not None else dense


def route_rows(x: torch.Tensor, topk: int) -> torch.Tensor:
    """``[T·topk, K]``: route r = t·topk + j reads x[t] (x is [T, K]) or x[t, j]."""
    return x.repeat_interleave(topk, dim=0) if x.dim() == 2 else x.reshape(-1, x.shape[-1])


class TorchMoE(TRTLLMMoEKernel):
    name: ClassVar[str] = "trtllm_moe_torch"
    prepared_type: ClassVar[type] = ExpertWeights
    priority: ClassVar[int] = 10
    description: ClassVar[str] = "plain PyTorch: sort by expert, dequantize each touched expert, fp32 matmul"
    requires: ClassVar[Requirements] = Requirements(device_types=frozenset({"cpu", "cuda", "xpu", "npu"}))

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # Each touched expert is dequantized to float32 per call (the codes read, the scale
        # rows and the float32 weight written and read: ~17 bytes a weight), then an fp32
        # matmul (~6 % of the bf16 tensor-core rate on the H100: trtllm_moe.json).
        return Cost(moe_bytes(problem, per_weight=17.0), moe_flops(problem), 0.5, 0.06,
                    3 * touched_experts(problem), "fit to benchmarks/results")

    def prepared_schema(self, dims: Mapping[str, int]) -> Fields:
        return expert_schema(ExpertWeights, self.fmt, dims, "qweight")  # type: ignore[arg-type]

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> ExpertWeights:
        return load_expert_weights(self.fmt, tensors, self.device, dtype)  # type: ignore[arg-type]

    def __call__(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        prepared: ExpertWeights,
        *,
        topk_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self.require_prepared(prepared)
        t, topk = check_routing(
            x, topk_ids, topk_weights, num_experts=prepared.num_experts, k=prepared.k,
            dtypes=ACT_DTYPES, device=prepared.qweight.device,
        )
        rows = route_rows(x, topk).float()
        ids = topk_ids.reshape(-1)
        y = torch.empty(rows.shape[0], prepared.n, dtype=torch.float32, device=rows.device)
        order = torch.argsort(ids, stable=True)
        counts = torch.bincount(ids, minlength=prepared.num_experts).tolist()
        start = 0
        for e, count in enumerate(counts):
            if count:
                sel = order[start : start + count]
                y[sel] = rows[sel] @ dequantize_expert(prepared, e)
                start += count
        y = y.view(t, topk, prepared.n)
        if topk_weights is not None:
            return (y * topk_weights.float().unsqueeze(-1)).sum(dim=1).to(x.dtype)
        return y.to(x.dtype)
