"""The dequantize-then-matmul kernel, one subclass per linear format."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from quantcore.cost import Cost, linear_cost
from quantcore.dtypes import dtype_name
from quantcore.errors import KernelInputError, UnsupportedProblemError
from quantcore.kernel import LinearKernel, Requirements, Support
from quantcore.probe import Capabilities
from quantcore.problem import Problem
from quantcore.schema import Fields, Maybe, OneOf, TensorSpec
from quantcore.tensors import check_activation, stored_on

__all__ = ["DenseWeight", "DequantLinear", "fallback_for", "holding_dtype"]

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Mantissa bits: a weight can serve an activation of its own precision or less.
_PRECISION = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}
#: The largest finite value of each dtype.
_MAX = {d: torch.finfo(d).max for d in FLOAT_DTYPES}


@dataclass(frozen=True)
class DenseWeight:
    weight: torch.Tensor  # [N, K] in the prepared dtype
    bias: torch.Tensor | None


class DequantLinear(LinearKernel):
    name: ClassVar[str] = "torch_fallback"
    format: ClassVar[str] = ""
    priority: ClassVar[int] = 0
    keeps_dense_weight: ClassVar[bool] = True
    description: ClassVar[str] = "dequantize to a dense weight, then torch.nn.functional.linear"
    requires: ClassVar[Requirements] = Requirements(device_types=frozenset({"cpu", "cuda", "xpu", "npu"}))

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        if problem.act_dtype not in FLOAT_DTYPES:
            return Support.no(f"activation dtype {problem.act_dtype}: expected bf16, fp16 or fp32")
        return Support.yes()

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # The dense matmul itself, on a weight in the activation dtype (benchmarks/results:
        # the dense_bf16 peer, which this kernel matches). cuBLAS on the H100 and the H200
        # ({gptq,awq}_linear.json): ~6 µs of fixed cost (three launches' worth), then the
        # weight at ~1.1× the copy ceiling (a copy's bytes are half writes, a GEMV's are
        # reads): 8 µs at 8 MB, 13–17 µs at 34 MB, 31–45 µs at 117 MB; its full matmul rate.
        # torch on the AMD EPYC at ~37 % of the copy bandwidth and ~80 % of the matmul rate.
        w = problem.act_dtype.itemsize * problem["K"] * problem["N"]
        if caps.device_type == "cpu":
            return linear_cost(problem, w, bandwidth=0.37, compute=0.8, note="dense matmul")
        return linear_cost(problem, w, bandwidth=1.1, compute=1.0, launches=3, note="dense matmul")

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> DenseWeight:
        tensors = stored_on(tensors, self.device, where=f"{self.name} prepare")
        self.fmt.validate(tensors)
        # Without a dtype the weight stays float32: any activation can use it without
        # losing precision (a float16 weight would silently cost a float32 call 11 bits).
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in FLOAT_DTYPES:
            raise KernelInputError(f"dtype: expected bf16, fp16 or fp32, got {dtype}")
        # float64, rounded once: a format whose dequantization sums (TurboQuant's rotation)
        # then gives the same bits on every device, whatever order its BLAS sums in.
        dense = self.fmt.dequantize(tensors, dtype=torch.float64)
        bias = tensors.get("bias")
        dtype = holding_dtype(dense, dtype, bias)
        return DenseWeight(dense.to(dtype), bias.to(dtype) if bias is not None else None)

    def __call__(self, x: torch.Tensor, prepared: DenseWeight) -> torch.Tensor:
        if type(prepared) is not DenseWeight:
            raise KernelInputError(
                f"prepared: expected the DenseWeight that torch_fallback.prepare returns, got {type(prepared).__name__}"
            )
        w = prepared.weight
        check_activation(x, k=w.shape[1], dtypes=FLOAT_DTYPES, device=w.device)
        if _PRECISION[x.dtype] > _PRECISION[w.dtype]:
            raise KernelInputError(
                f"x: a {dtype_name(x.dtype)} activation needs more precision than the {dtype_name(w.dtype)} "
                f"weight prepare made; prepare with dtype={x.dtype} (or none: float32)"
            )
        bias = prepared.bias
        if x.dtype == w.dtype:
            return torch.nn.functional.linear(x, w, bias)
        if _MAX[x.dtype] < _MAX[w.dtype] / 2:
            # x's exponent range is narrower than the weight's (float16): the weight's
            # values may not fit it, so multiply in the weight's dtype, round the result once.
            return torch.nn.functional.linear(x.to(w.dtype), w, bias).to(x.dtype)
        return torch.nn.functional.linear(x, w.to(x.dtype), bias.to(x.dtype) if bias is not None else None)

    def prepared_schema(self, dims: Mapping[str, int]) -> OneOf:
        k, n = dims["K"], dims["N"]
        return OneOf(*(Fields(DenseWeight, weight=TensorSpec((n, k), (d,)), bias=Maybe(TensorSpec((n,), (d,))))
                       for d in FLOAT_DTYPES))


def holding_dtype(dense: torch.Tensor, dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.dtype:
    """``dtype``, or the narrowest wider one (float32) whose range holds every finite value
    of the dense weight (and bias): a copy in a dtype too narrow would turn finite weights
    into Inf. Refused when even float32 cannot hold them."""
    top = max(_finite_max(dense), _finite_max(bias))
    for candidate in (dtype, torch.float32):
        if top <= _MAX[candidate]:
            return candidate
    raise UnsupportedProblemError(
        f"weight: dequantized values reach {top:.3g}, beyond float32's range ({_MAX[torch.float32]:.3g}): "
        "torch_fallback keeps at most a float32 copy"
    )


def _finite_max(t: torch.Tensor | None) -> float:
    if t is None or t.numel() == 0:
        return 0.0
    a = t.detach().abs().double()
    a = a[torch.isfinite(a)]
    return float(a.max()) if a.numel() else 0.0


def fallback_for(format_name: str) -> type[DequantLinear]:
    """The fallback kernel class for one linear format."""
    return type(f"DequantLinear_{format_name}", (DequantLinear,), {"format": format_name, "__module__": __name__})
