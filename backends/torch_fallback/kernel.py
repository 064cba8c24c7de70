"""The dequantize-then-matmul kernel, one subclass per linear format."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from quantcore.errors import KernelInputError
from quantcore.kernel import LinearKernel, Requirements, Support
from quantcore.problem import Problem
from quantcore.tensors import check_activation, stored_on

__all__ = ["DenseWeight", "DequantLinear", "fallback_for"]

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class DenseWeight:
    weight: torch.Tensor  # [N, K] in the prepared dtype
    bias: torch.Tensor | None


class DequantLinear(LinearKernel):
    name: ClassVar[str] = "torch_fallback"
    format: ClassVar[str] = ""
    priority: ClassVar[int] = 0
    description: ClassVar[str] = "dequantize to a dense weight, then torch.nn.functional.linear"
    requires: ClassVar[Requirements] = Requirements(device_types=frozenset({"cpu", "cuda", "xpu", "npu"}))

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        if problem.act_dtype not in FLOAT_DTYPES:
            return Support.no(f"activation dtype {problem.act_dtype}: expected bf16, fp16 or fp32")
        return Support.yes()

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> DenseWeight:
        tensors = stored_on(tensors, self.device, where=f"{self.name} prepare")
        self.fmt.validate(tensors)
        dtype = dtype or tensors.get("scales", next(iter(tensors.values()))).dtype
        if dtype not in FLOAT_DTYPES:
            raise KernelInputError(f"dtype: expected bf16, fp16 or fp32, got {dtype}")
        weight = self.fmt.dequantize(tensors, dtype=torch.float32).to(dtype)
        bias = tensors.get("bias")
        return DenseWeight(weight, bias.to(dtype) if bias is not None else None)

    def __call__(self, x: torch.Tensor, prepared: DenseWeight) -> torch.Tensor:
        if type(prepared) is not DenseWeight:
            raise KernelInputError(
                f"prepared: expected the DenseWeight that torch_fallback.prepare returns, got {type(prepared).__name__}"
            )
        w = prepared.weight
        check_activation(x, k=w.shape[1], dtypes=FLOAT_DTYPES, device=w.device)
        bias = prepared.bias
        if x.dtype != w.dtype:
            w = w.to(x.dtype)
            bias = bias.to(x.dtype) if bias is not None else None
        return torch.nn.functional.linear(x, w, bias)


def fallback_for(format_name: str) -> type[DequantLinear]:
    """The fallback kernel class for one linear format."""
    return type(f"DequantLinear_{format_name}", (DequantLinear,), {"format": format_name, "__module__": __name__})
