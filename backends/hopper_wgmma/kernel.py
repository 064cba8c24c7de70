"""The ``hopper_wgmma`` kernels: GPTQ (4/8-bit) and AWQ (4-bit) linears on Hopper (sm_90)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from quantcore.cost import Cost, grouped_weight_bytes, linear_cost
from quantcore.dtypes import dtype_name
from quantcore.errors import KernelInputError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.kernel import LinearKernel, Requirements, Support
from quantcore.probe import Capabilities
from quantcore.problem import Problem
from quantcore.tensors import check_activation, stored_on
from quantcore.transforms.awq_gptq import AWQToGPTQ, gptq_format_for

from .layout import SLICE, SUPPORTED_BITS, GPTQToHopper, HopperWeights, block_k

__all__ = ["ACT_DTYPES", "HopperWgmmaAWQ", "HopperWgmmaGPTQ"]

ACT_DTYPES = (torch.bfloat16, torch.float16)


def _gptq_supports(fmt: GPTQ, problem: Problem) -> Support:
    if fmt.bits not in SUPPORTED_BITS:
        return Support.no(f"bits={fmt.bits}: hopper_wgmma runs {'- and '.join(map(str, SUPPORTED_BITS))}-bit codes")
    if problem.act_dtype not in ACT_DTYPES:
        names = " and ".join(dtype_name(d) for d in ACT_DTYPES)
        return Support.no(f"activation dtype {dtype_name(problem.act_dtype)}: hopper_wgmma takes {names}")
    bk = block_k(fmt.bits)
    gs = fmt.group_size
    if gs != -1 and not (gs % bk == 0 or (bk % gs == 0 and gs % SLICE == 0)):
        return Support.no(
            f"group_size={gs}: hopper_wgmma fetches scales per {bk}-input block, so groups must divide "
            f"the block (and be multiples of {SLICE}) or be multiples of it (or -1)"
        )
    return Support.yes()


class HopperWgmmaGPTQ(LinearKernel):
    name: ClassVar[str] = "hopper_wgmma"
    format: ClassVar[str] = "gptq"
    #: Above triton_int4 (110) on sm_90, where its declared cost is lower at every M
    #: (README.md); the costs decide.
    priority: ClassVar[int] = 120
    description: ClassVar[str] = ("GPTQ 4/8-bit on Hopper in Gluon: TMA ring, dequantized operand in registers, "
                                  "async wgmma, split-K")
    #: wgmma and TMA: sm_90a only (Gluon compiles it for that target; no interpreter).
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda"}), min_capability=(9, 0), max_capability=(9, 0), packages=("triton",)
    )

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # Read off benchmarks/results/nvidia-h200/gptq_linear.json beside the declared costs
        # of triton_int4 and aten_cuda (README.md): the weight streams as fast as
        # triton_int4's; at M ≤ 2 the split-K pass and its reduction cost about a launch
        # more than tinygemm's single GEMV; from M = 32 to 1024 the multiply runs 1.3–2×
        # faster than triton_int4's fused tiles; above, triton_int4's dequantize + cuBLAS
        # is faster.
        fmt = problem.format
        bits, gs = (fmt.bits, fmt.group_size) if isinstance(fmt, GPTQ) else (4, getattr(fmt, "group_size", -1))
        k, n, m = problem["K"], problem["N"], problem["M"]
        weight = grouped_weight_bytes(k, n, bits, gs if gs > 0 else k, scale_bytes=2, zero_bits=8)
        if caps.device_type != "cuda":
            return linear_cost(problem, weight, bandwidth=1e-3, compute=1e-3, note="no GPU: never chosen")
        compute = 0.45 if m <= 64 else 0.6 if m <= 256 else 0.75 if m <= 1024 else 0.65
        return linear_cost(problem, weight, bandwidth=0.6, compute=compute, launches=2 if m <= 2 else 1,
                           note="fit to benchmarks/results/nvidia-h200 (hopper_wgmma README.md)")

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        fmt = problem.format
        if not isinstance(fmt, GPTQ):
            return Support.no(f"format {fmt.slug} is not GPTQ")
        return _gptq_supports(fmt, problem)

    def _gptq(self, tensors: Mapping[str, torch.Tensor]) -> tuple[GPTQ, Mapping[str, torch.Tensor]]:
        return self.fmt, tensors  # type: ignore[return-value]

    def prepare(self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None) -> HopperWeights:
        if dtype is not None and dtype not in ACT_DTYPES:
            names = ", ".join(dtype_name(d) for d in ACT_DTYPES)
            raise KernelInputError(f"dtype: expected {names}, got {dtype}")
        fmt, gptq = self._gptq(stored_on(tensors, self.device, where=f"{self.name} prepare"))
        return GPTQToHopper(fmt).apply(gptq)

    def __call__(self, x: torch.Tensor, prepared: HopperWeights) -> torch.Tensor:
        if type(prepared) is not HopperWeights:
            raise KernelInputError(
                f"prepared: expected the HopperWeights that {self.name}.prepare returns, got {type(prepared).__name__}"
            )
        k, n = prepared.in_features, prepared.out_features
        check_activation(x, k=k, dtypes=ACT_DTYPES, device=prepared.qweight.device)
        x2 = x.reshape(-1, k)
        if x2.shape[0] == 0:
            return x.new_empty(*x.shape[:-1], n)
        if prepared.ret_idx is not None:
            x2 = x2.index_select(1, prepared.ret_idx)
        from .launch import linear  # imports triton: only when a call runs

        return linear(x2, prepared).view(*x.shape[:-1], n)


class HopperWgmmaAWQ(HopperWgmmaGPTQ):
    format: ClassVar[str] = "awq"
    description: ClassVar[str] = "AWQ 4-bit via GPTQ lanes and hopper_wgmma"

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        fmt = problem.format
        if not isinstance(fmt, AWQ):
            return Support.no(f"format {fmt.slug} is not AWQ")
        return _gptq_supports(gptq_format_for(fmt), problem)

    def _gptq(self, tensors: Mapping[str, torch.Tensor]) -> tuple[GPTQ, Mapping[str, torch.Tensor]]:
        fmt: AWQ = self.fmt  # type: ignore[assignment]
        return gptq_format_for(fmt), AWQToGPTQ(fmt).apply(tensors)
