"""The ``hopper_wgmma`` kernels: GPTQ (4/8-bit) and AWQ (4-bit) linears on Hopper (sm_90)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from quantcore.cost import Cost, column_fill, linear_cost
from quantcore.formats.gptq import GPTQ
from quantcore.kernel import Requirements, Support
from quantcore.kernels.gptq_pairs.kernel import (
    ACT_DTYPES,
    AWQViaGPTQLanes,
    PairedGPTQKernel,
    weight_bytes,
)
from quantcore.kernels.gptq_pairs.layout import SLICE, block_k
from quantcore.probe import Capabilities
from quantcore.problem import Problem

from .layout import GPTQToHopper, HopperWeights

__all__ = ["ACT_DTYPES", "HopperWgmmaAWQ", "HopperWgmmaGPTQ"]


class HopperWgmmaGPTQ(PairedGPTQKernel):
    name: ClassVar[str] = "hopper_wgmma"
    #: Above triton_int4 (110) on sm_90, where its declared cost is lower at every M
    #: (README.md); the costs decide.
    priority: ClassVar[int] = 120
    description: ClassVar[str] = ("GPTQ 4/8-bit on Hopper in Gluon: TMA ring, dequantized operand in registers, "
                                  "async wgmma, split-K")
    #: wgmma and TMA: sm_90a only (Gluon compiles it for that target; no interpreter).
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda"}), min_capability=(9, 0), max_capability=(9, 0), packages=("triton",)
    )
    transform = GPTQToHopper
    prepared_type = HopperWeights

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # Read off benchmarks/results/nvidia-h200/gptq_linear.json beside the declared costs
        # of triton_int4 and aten_cuda (README.md): the weight streams as fast as
        # triton_int4's; at M ≤ 2 the split-K pass and its reduction cost about a launch
        # more than tinygemm's single GEMV; from M = 32 to 1024 the multiply runs 1.3–2×
        # faster than triton_int4's fused tiles; above, triton_int4's dequantize + cuBLAS
        # is faster.
        m = problem["M"]
        weight = weight_bytes(problem)
        if caps.device_type != "cuda":
            return linear_cost(problem, weight, bandwidth=1e-3, compute=1e-3, note="no GPU: never chosen")
        compute = 0.45 if m <= 64 else 0.6 if m <= 256 else 0.75 if m <= 1024 else 0.65
        if m > 64:
            compute *= column_fill(problem["N"])
        return linear_cost(problem, weight, bandwidth=0.6, compute=compute, launches=2 if m <= 2 else 1,
                           note="fit to benchmarks/results/nvidia-h200 (hopper_wgmma README.md)")

    @classmethod
    def layout_supports(cls, fmt: GPTQ, problem: Problem) -> Support:
        bk = block_k(fmt.bits)
        gs = fmt.group_size
        if gs != -1 and not (gs % bk == 0 or (bk % gs == 0 and gs % SLICE == 0)):
            return Support.no(
                f"group_size={gs}: hopper_wgmma fetches scales per {bk}-input block, so groups must divide "
                f"the block (and be multiples of {SLICE}) or be multiples of it (or -1)"
            )
        return Support.yes()

    @staticmethod
    @functools.cache
    def launcher() -> Callable[[torch.Tensor, Any], torch.Tensor]:
        """``launch.linear``, imported on the first call (it imports triton)."""
        from .launch import linear

        return linear


class HopperWgmmaAWQ(AWQViaGPTQLanes, HopperWgmmaGPTQ):
    description: ClassVar[str] = "AWQ 4-bit via GPTQ lanes and hopper_wgmma"
