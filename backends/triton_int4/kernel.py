"""The ``triton_int4`` kernels: GPTQ (4/8-bit) and AWQ (4-bit) linears in Triton."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from quantcore.cost import Cost, device_rates, linear_cost
from quantcore.formats.gptq import GPTQ
from quantcore.kernel import Requirements, Support
from quantcore.kernels.gptq_pairs.kernel import (
    ACT_DTYPES,
    AWQViaGPTQLanes,
    PairedGPTQKernel,
    code_bits,
    weight_bytes,
)
from quantcore.kernels.gptq_pairs.layout import SLICE
from quantcore.probe import Capabilities
from quantcore.problem import Problem
from quantcore.schema import Depends
from quantcore.triton import TESTED_TRITON

from .layout import GPTQToTritonInt, TritonIntWeights, triton_int_schema

__all__ = ["ACT_DTYPES", "INTERPRETER_MAX_WEIGHTS", "TritonInt4AWQ", "TritonInt4GPTQ"]

#: Under Triton's interpreter (a CPU), larger weights take too long per call to test:
#: ~1 s per 2^20 codes on one core. The shape still runs compiled on CUDA.
INTERPRETER_MAX_WEIGHTS = 1 << 21


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


#: Above this M a call dequantizes the weight into a scratch and multiplies with cuBLAS
#: (``configs.py``).
DEQUANT_FROM_M = 1024
#: cuBLAS's share of the matmul rate at M ≥ 2048 on these shapes (0.94–1.06 in the suites).
CUBLAS_SHARE = 0.98


def _dequant_then_cublas_share(caps: Capabilities, problem: Problem) -> float:
    """The dequantize + cuBLAS path as one share of the matmul rate: cuBLAS's multiply after
    the dequantization's bytes (the codes read, the dense weight written). Fit to the suites
    at M = 2048 and 8192 (``benchmarks/results/nvidia-h200/gptq_linear.json``, the H100's
    too): 4096×14336 and 14336×4096 at M = 2048 0.87–0.91 of the matmul rate (cuBLAS 0.97–1.05), from
    M = 8192 0.95–1.09. A dense weight that fits the last-level cache (4096×4096: 0.95–1.00
    at M = 2048) is faster than this says: cuBLAS reads back what the scratch left there."""
    rates = device_rates(caps)
    k, n = problem["K"], problem["N"]
    dequant_bytes = weight_bytes(problem) + k * n * problem.act_dtype.itemsize
    gemm_s = 2 * problem["M"] * k * n / (rates.matmul_flops_per_s * CUBLAS_SHARE)
    return CUBLAS_SHARE / (1 + dequant_bytes / (rates.copy_bytes_per_s * 0.85) / gemm_s)


class TritonInt4GPTQ(PairedGPTQKernel):
    name: ClassVar[str] = "triton_int4"
    #: Above aten_cuda (100) on CUDA: on the H100 2–20× faster from M = 16 on, at most 27%
    #: slower at M ≤ 4 (README.md); the declared costs choose between the two per shape.
    priority: ClassVar[int] = 110
    description: ClassVar[str] = "GPTQ 4/8-bit in Triton: tensor-core dequant-in-registers GEMM, split-K"
    #: bf16 tensor cores on CUDA; the CPU runs it under Triton's interpreter.
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda", "cpu"}), min_capability=(8, 0), packages=("triton",),
        min_versions=(TESTED_TRITON,)
    )
    transform = GPTQToTritonInt
    prepared_type = TritonIntWeights

    @classmethod
    def priority_on(cls, caps: Capabilities) -> int:
        # On CPU this is Triton's interpreter: a correctness tool, far slower than torch,
        # so below even torch_fallback (0): asked for by name only.
        return -10 if caps.device_type == "cpu" else cls.priority

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # Fit to benchmarks/results/nvidia-h100-80gb-hbm3/{gptq,gptq8}_linear.json and
        # benchmarks/results/nvidia-h200/{gptq,gptq8}_linear.json (CUDA graphs). Up to M ≈ 32
        # the weight streams after ~4 µs of fixed cost (the split-K reduction) at a rate set by
        # the latency of each slice's dequantize → MMA → wait (README.md), the same rate on
        # both cards: 1.7–2.3 TB/s at 4 bits, and at 8 bits 1.8–2.3 TB/s on the large shapes
        # (4096×14336, 14336×4096 at M ≤ 16), the H200's faster memory unused.
        # The multiply reaches ~30 % of the bf16 matmul rate to M = 256 and 35–48 % at
        # M = 512 with its fused tiles (a quarter of that at N = 1024); above M = 1024 it
        # dequantizes into a scratch and calls cuBLAS (``_dequant_then_cublas_share``). On a
        # CPU this is Triton's interpreter: thousands of times slower than torch.
        m = problem["M"]
        weight = weight_bytes(problem)
        if caps.device_type == "cpu":
            return linear_cost(problem, weight, bandwidth=2e-4, compute=2e-4, note="Triton interpreter")
        if m > DEQUANT_FROM_M:
            compute = _dequant_then_cublas_share(caps, problem)
        else:
            compute = 0.3 if m <= 256 else 0.45
            if m > 64:  # its own fused tiles: a quarter of the rate at N = 1024
                compute *= min(1.0, problem["N"] / 4096)
        return linear_cost(problem, weight, bandwidth=0.8, compute=compute, launches=2,
                           stream_bytes_per_s=1.8e12 if code_bits(problem) == 4 else 2.3e12,
                           note="fit to benchmarks/results/nvidia-h100-80gb-hbm3 and nvidia-h200")

    @classmethod
    def layout_supports(cls, fmt: GPTQ, problem: Problem) -> Support:
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

    def prepared_schema(self, dims: Mapping[str, int]) -> Depends:
        return triton_int_schema(self._gptq_format(), dims["K"], dims["N"])

    @staticmethod
    @functools.cache
    def launcher() -> Callable[[torch.Tensor, Any], torch.Tensor]:
        """``launch.linear``, imported on the first call (it imports triton)."""
        from .launch import linear

        return linear


class TritonInt4AWQ(AWQViaGPTQLanes, TritonInt4GPTQ):
    description: ClassVar[str] = "AWQ 4-bit via GPTQ lanes and triton_int4"
