"""torch's CPU int4pack op (``aten._weight_int4pack_mm_for_cpu``) behind a linear kernel:
what it requires, the shapes it takes, what it costs and the call. A subclass names its
format and brings the weight into the op's layout (``prepare``): GPTQ directly
(``aten_cpu``), AWQ through GPTQ lanes (``awq_cpu``); the layout is
:mod:`quantcore.transforms.int4pack_cpu`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from ..cost import Cost
from ..kernel import LinearKernel, Requirements, Support
from ..probe import Capabilities
from ..problem import Problem
from ..schema import OneOf, TensorSpec
from ..transforms.int4pack_cpu import N_ALIGN, OP_GROUP_SIZES, Int4PackCPU
from ..transforms.packed import expect_prepared, int4pack_cost, int4pack_supports, packed_schema

__all__ = ["ACT_DTYPES", "Int4PackCpuKernel"]

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class Int4PackCpuKernel(LinearKernel):
    priority: ClassVar[int] = 100
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cpu"}),
        aten_ops=("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu"),
    )

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        """The op's limits, for a GPTQ problem (a subclass maps its format to GPTQ's)."""
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

    def prepared_schema(self, dims: Mapping[str, int]) -> OneOf:
        k, n = dims["K"], dims["N"]
        return packed_schema(
            Int4PackCPU, k, n, group_sizes=OP_GROUP_SIZES, act_dtypes=ACT_DTYPES,
            weight=lambda g: TensorSpec((n, k // 2), (torch.uint8,)),
            meta=lambda g, dtypes: TensorSpec((k // g, n, 2), dtypes),
        )

    def __call__(self, x: torch.Tensor, prepared: Int4PackCPU) -> torch.Tensor:
        expect_prepared(prepared, Int4PackCPU, self.name)
        op = torch.ops.aten._weight_int4pack_mm_for_cpu
        return prepared.run(x, lambda x2, meta: op(x2, prepared.weight, prepared.group_size, meta), ACT_DTYPES)
