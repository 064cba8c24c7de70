"""The ``triton_int4`` kernels: GPTQ (4/8-bit) and AWQ (4-bit) linears in Triton."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from quantcore.cost import Cost, grouped_weight_bytes, linear_cost
from quantcore.dtypes import dtype_name
from quantcore.errors import KernelInputError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.kernel import LinearKernel, Requirements, Support
from quantcore.probe import Capabilities
from quantcore.problem import Problem
from quantcore.schema import Depends
from quantcore.tensors import stored_on
from quantcore.transforms.awq_gptq import AWQToGPTQ, gptq_format_for
from quantcore.triton.checks import check_x

from .layout import SLICE, SUPPORTED_BITS, GPTQToTritonInt, TritonIntWeights, triton_int_schema

__all__ = ["ACT_DTYPES", "INTERPRETER_MAX_WEIGHTS", "TritonInt4AWQ", "TritonInt4GPTQ"]

ACT_DTYPES = (torch.bfloat16, torch.float16)
#: Under Triton's interpreter (a CPU), larger weights take too long per call to test:
#: ~1 s per 2^20 codes on one core. The shape still runs compiled on CUDA.
INTERPRETER_MAX_WEIGHTS = 1 << 21


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _gptq_supports(fmt: GPTQ, problem: Problem) -> Support:
    if fmt.bits not in SUPPORTED_BITS:
        return Support.no(f"bits={fmt.bits}: triton_int4 runs {'- and '.join(map(str, SUPPORTED_BITS))}-bit codes")
    if problem.act_dtype not in ACT_DTYPES:
        names = " and ".join(dtype_name(d) for d in ACT_DTYPES)
        return Support.no(f"activation dtype {dtype_name(problem.act_dtype)}: triton_int4 takes {names}")
    if fmt.group_size != -1 and fmt.group_size % SLICE:
        return Support.no(
            f"group_size={fmt.group_size}: triton_int4 reads one scale per run of {SLICE} sorted inputs, "
            f"so groups must be multiples of {SLICE} (or -1)"
        )
    k, n = problem.get("K"), problem.get("N")
    if _interpreting() and k is not None and n is not None and k > 0 and n > 0 and k * n > INTERPRETER_MAX_WEIGHTS:
        return Support.no(
            f"K·N = {k * n} weights: under Triton's interpreter (CPU) triton_int4 takes at most "
            f"{INTERPRETER_MAX_WEIGHTS} (a call would take minutes); the shape runs compiled on CUDA"
        )
    return Support.yes()


class TritonInt4GPTQ(LinearKernel):
    name: ClassVar[str] = "triton_int4"
    format: ClassVar[str] = "gptq"
    #: Above aten_cuda (100) on CUDA: on the H100 2–20× faster from M = 16 on, at most 27%
    #: slower at M ≤ 4 (README.md); the declared costs choose between the two per shape.
    priority: ClassVar[int] = 110
    description: ClassVar[str] = "GPTQ 4/8-bit in Triton: tensor-core dequant-in-registers GEMM, split-K"
    #: bf16 tensor cores on CUDA; the CPU runs it under Triton's interpreter.
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda", "cpu"}), min_capability=(8, 0), packages=("triton",)
    )

    @classmethod
    def priority_on(cls, caps: Capabilities) -> int:
        # On CPU this is Triton's interpreter: a correctness tool, far slower than torch,
        # so below even torch_fallback (0): asked for by name only.
        return -10 if caps.device_type == "cpu" else cls.priority

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # benchmarks/results/nvidia-h100-80gb-hbm3/gptq_linear.json (CUDA graphs): the weight
        # streams at ~60 % of the copy bandwidth up to M ≈ 32 (split-K MMA tiles), after ~4 µs
        # of fixed cost (the split-K reduction);
        # the multiply reaches ~30 % of the bf16 matmul rate at M = 64, ~40 % at 128-256,
        # ~70 % at 512-1024 (128×128 fused tiles) and ~85 % above (dequantize + cuBLAS).
        # On a CPU this is Triton's interpreter: thousands of times slower than torch.
        fmt = problem.format
        bits, gs = (fmt.bits, fmt.group_size) if isinstance(fmt, GPTQ) else (4, getattr(fmt, "group_size", -1))
        k, n, m = problem["K"], problem["N"], problem["M"]
        weight = grouped_weight_bytes(k, n, bits, gs if gs > 0 else k, scale_bytes=2, zero_bits=8)
        if caps.device_type == "cpu":
            return linear_cost(problem, weight, bandwidth=2e-4, compute=2e-4, note="Triton interpreter")
        compute = 0.3 if m <= 64 else 0.4 if m <= 256 else 0.7 if m <= 1024 else 0.85
        return linear_cost(problem, weight, bandwidth=0.6, compute=compute, launches=2,
                           note="fit to benchmarks/results/nvidia-h100-80gb-hbm3")

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        fmt = problem.format
        if not isinstance(fmt, GPTQ):
            return Support.no(f"format {fmt.slug} is not GPTQ")
        return _gptq_supports(fmt, problem)

    def _gptq(self, tensors: Mapping[str, torch.Tensor]) -> tuple[GPTQ, Mapping[str, torch.Tensor]]:
        return self.fmt, tensors  # type: ignore[return-value]

    def _gptq_format(self) -> GPTQ:
        return self.fmt  # type: ignore[return-value]

    def prepared_schema(self, dims: Mapping[str, int]) -> Depends:
        return triton_int_schema(self._gptq_format(), dims["K"], dims["N"])

    def prepare(self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None) -> TritonIntWeights:
        if dtype is not None and dtype not in ACT_DTYPES:
            names = ", ".join(dtype_name(d) for d in ACT_DTYPES)
            raise KernelInputError(f"dtype: expected {names}, got {dtype}")
        fmt, gptq = self._gptq(stored_on(tensors, self.device, where=f"{self.name} prepare"))
        return GPTQToTritonInt(fmt).apply(gptq)

    def __call__(self, x: torch.Tensor, prepared: TritonIntWeights) -> torch.Tensor:
        if type(prepared) is not TritonIntWeights:
            raise KernelInputError(
                f"prepared: expected the TritonIntWeights that {self.name}.prepare returns, got {type(prepared).__name__}"
            )
        k, n = prepared.in_features, prepared.out_features
        linear = _launcher()
        check_x(x, k, ACT_DTYPES, prepared.qweight.device)
        flat = x.dim() == 2
        x2 = x if flat else x.reshape(-1, k)
        if x2.shape[0] == 0:
            return x.new_empty(*x.shape[:-1], n)
        x2 = x2.index_select(1, prepared.ret_idx) if prepared.ret_idx is not None else x2.contiguous()
        y = linear(x2, prepared)
        return y if flat else y.view(*x.shape[:-1], n)


def _launcher() -> Any:
    """``launch.linear``, imported on the first call (it imports triton)."""
    global _LINEAR
    if _LINEAR is None:
        from .launch import linear

        _LINEAR = linear
    return _LINEAR


_LINEAR: Any = None


class TritonInt4AWQ(TritonInt4GPTQ):
    format: ClassVar[str] = "awq"
    description: ClassVar[str] = "AWQ 4-bit via GPTQ lanes and triton_int4"

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        fmt = problem.format
        if not isinstance(fmt, AWQ):
            return Support.no(f"format {fmt.slug} is not AWQ")
        return _gptq_supports(gptq_format_for(fmt), problem)

    def _gptq(self, tensors: Mapping[str, torch.Tensor]) -> tuple[GPTQ, Mapping[str, torch.Tensor]]:
        fmt: AWQ = self.fmt  # type: ignore[assignment]
        return gptq_format_for(fmt), AWQToGPTQ(fmt).apply(tensors)

    def _gptq_format(self) -> GPTQ:
        return gptq_format_for(self.fmt)  # type: ignore[arg-type]
