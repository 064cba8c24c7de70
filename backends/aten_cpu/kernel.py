"""The ``aten_cpu`` kernel: ``aten._weight_int4pack_mm_for_cpu`` behind GPTQ's contract."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from quantcore.cost import Cost
from quantcore.kernel import LinearKernel, Requirements, Support
from quantcore.probe import Capabilities
from quantcore.problem import Problem
from quantcore.tensors import stored_on
from quantcore.transforms.packed import expect_prepared, int4pack_cost, int4pack_supports

from .transform import N_ALIGN, OP_GROUP_SIZES, GPTQToInt4PackCPU, Int4PackCPU

__all__ = ["AtenCpuGPTQ"]

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class AtenCpuGPTQ(LinearKernel):
    name: ClassVar[str] = "aten_cpu"
    format: ClassVar[str] = "gptq"
    priority: ClassVar[int] = 100
    description: ClassVar[str] = "GPTQ 4-bit via aten._weight_int4pack_mm_for_cpu"
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cpu"}),
        aten_ops=("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu"),
    )

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        return int4pack_supports(
            problem, op="the op", act_dtypes=ACT_DTYPES, n_align=N_ALIGN, k_align=OP_GROUP_SIZES[0],
            group_sizes=OP_GROUP_SIZES,
        )

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # benchmarks/results/amd-epyc/gptq_linear.json: memory-bound at M = 1 near 40 % of
        # the copy bandwidth; from M ≈ 16 compute-bound at about 40 % of the dense bf16
        # matmul rate (the op unpacks each int4 tile again for every row block), so a
        # dense matmul is faster there — but keeps 4× the memory.
        return int4pack_cost(problem, group_sizes=OP_GROUP_SIZES, bandwidth=0.4, compute=0.4,
                             note="fit to benchmarks/results/amd-epyc")

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> Int4PackCPU:
        tensors = stored_on(tensors, self.device, where=f"{self.name} prepare")
        return GPTQToInt4PackCPU(self.fmt).apply(tensors).ready_for(dtype, ACT_DTYPES)  # type: ignore[arg-type, return-value]

    def __call__(self, x: torch.Tensor, prepared: Int4PackCPU) -> torch.Tensor:
        expect_prepared(prepared, Int4PackCPU, self.name)
        op = torch.ops.aten._weight_int4pack_mm_for_cpu
        return prepared.run(x, lambda x2, meta: op(x2, prepared.weight, prepared.group_size, meta), ACT_DTYPES)
