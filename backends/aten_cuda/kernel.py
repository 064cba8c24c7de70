"""The ``aten_cuda`` kernels: GPTQ and AWQ 4-bit through torch's tinygemm."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from quantcore.cost import Cost
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.kernel import LinearKernel, Requirements, Support
from quantcore.probe import Capabilities
from quantcore.problem import Problem
from quantcore.tensors import stored_on
from quantcore.transforms.awq_gptq import AWQToGPTQ, gptq_format_for
from quantcore.transforms.packed import expect_prepared, int4pack_cost, int4pack_supports

from .transform import N_ALIGN, OP_GROUP_SIZES, GPTQToTinygemm, Int4PackCUDA

__all__ = ["AtenCudaAWQ", "AtenCudaGPTQ"]

#: tinygemm's mm takes bf16 activations only (``_weight_int4pack_mm`` checks it).
ACT_DTYPES = (torch.bfloat16,)


class AtenCudaGPTQ(LinearKernel):
    name: ClassVar[str] = "aten_cuda"
    format: ClassVar[str] = "gptq"
    priority: ClassVar[int] = 100
    description: ClassVar[str] = "GPTQ 4-bit via torch's tinygemm (aten._weight_int4pack_mm)"
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda"}),
        min_capability=(8, 0),
        aten_ops=("_convert_weight_to_int4pack", "_weight_int4pack_mm"),
    )

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        return int4pack_supports(
            problem, op="tinygemm", act_dtypes=ACT_DTYPES, n_align=N_ALIGN, k_align=32, group_sizes=OP_GROUP_SIZES
        )

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # benchmarks/results/nvidia-h100-80gb-hbm3/{gptq,awq}_linear.json and
        # benchmarks/results/nvidia-h200/{gptq,awq}_linear.json (CUDA graphs): at M = 1 its
        # loads are latency-bound, 1.8–1.9 TB/s on both cards (60 % of the H100's copy
        # bandwidth, 45 % of the H200's: 18.1–18.7 µs at 4096×14336 on each); then
        # compute-bound from M ≈ 8 at about 4 % of the bf16 matmul rate (tinygemm's mma tiles
        # are sized for a GEMV): 0.65× cuBLAS at M = 8, 0.37× at M = 32; below M = 16 its
        # tiles are emptier still (~3 %).
        return int4pack_cost(problem, group_sizes=OP_GROUP_SIZES, bandwidth=0.6,
                             compute=0.03 if problem["M"] <= 8 else 0.04, stream_bytes_per_s=1.8e12,
                             note="fit to benchmarks/results/nvidia-h100-80gb-hbm3 and nvidia-h200")

    def _gptq(self, tensors: Mapping[str, torch.Tensor]) -> tuple[GPTQ, Mapping[str, torch.Tensor]]:
        return self.fmt, tensors  # type: ignore[return-value]

    def prepare(self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None) -> Int4PackCUDA:
        fmt, gptq = self._gptq(stored_on(tensors, self.device, where=f"{self.name} prepare"))
        return GPTQToTinygemm(fmt).apply(gptq).ready_for(dtype, ACT_DTYPES)  # type: ignore[return-value]

    def __call__(self, x: torch.Tensor, prepared: Int4PackCUDA) -> torch.Tensor:
        expect_prepared(prepared, Int4PackCUDA, self.name)
        op = torch.ops.aten._weight_int4pack_mm
        return prepared.run(x, lambda x2, meta: op(x2, prepared.weight, prepared.group_size, meta), ACT_DTYPES)


class AtenCudaAWQ(AtenCudaGPTQ):
    format: ClassVar[str] = "awq"
    description: ClassVar[str] = "AWQ 4-bit via GPTQ lanes and torch's tinygemm"

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        fmt = problem.format
        if not isinstance(fmt, AWQ):
            return Support.no(f"format {fmt.slug} is not AWQ")
        return AtenCudaGPTQ.supports(Problem.of(gptq_format_for(fmt), dict(problem.dims), problem.act_dtype))

    def _gptq(self, tensors: Mapping[str, torch.Tensor]) -> tuple[GPTQ, Mapping[str, torch.Tensor]]:
        fmt: AWQ = self.fmt  # type: ignore[assignment]
        return gptq_format_for(fmt), AWQToGPTQ(fmt).apply(tensors)
