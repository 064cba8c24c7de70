"""The ``aten_cpu`` kernel: ``aten._weight_int4pack_mm_for_cpu`` behind GPTQ's contract."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from quantcore.errors import KernelInputError
from quantcore.formats.gptq import GPTQ
from quantcore.kernel import LinearKernel, Requirements, Support
from quantcore.problem import Problem
from quantcore.tensors import describe

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
        fmt = problem.format
        if not isinstance(fmt, GPTQ):
            return Support.no(f"format {fmt.slug} is not GPTQ")
        if fmt.bits != 4:
            return Support.no(f"bits={fmt.bits}: the op takes 4-bit codes only")
        if problem.act_dtype not in ACT_DTYPES:
            return Support.no(f"activation dtype {problem.act_dtype}: the op takes bf16, fp16, fp32")
        n, k = problem.get("N"), problem.get("K")
        if n is not None and n % N_ALIGN:
            return Support.no(f"N={n}: the op packs weights only when N % {N_ALIGN} == 0")
        gs = fmt.group_size if fmt.group_size != -1 else k
        if gs is not None and not any(gs % g == 0 for g in OP_GROUP_SIZES):
            return Support.no(
                f"group_size={fmt.group_size}: the op takes groups of {'/'.join(map(str, OP_GROUP_SIZES))} "
                "and none of them divides it"
            )
        if k is not None and k % OP_GROUP_SIZES[0]:
            return Support.no(f"K={k}: the op needs K % {OP_GROUP_SIZES[0]} == 0")
        return Support.yes()

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> Int4PackCPU:
        prepared = GPTQToInt4PackCPU(self.fmt).apply(tensors)  # type: ignore[arg-type]
        if dtype is not None:
            if dtype not in ACT_DTYPES:
                raise KernelInputError(f"dtype: expected bf16, fp16 or fp32, got {dtype}")
            prepared.for_dtype(dtype)
        return prepared

    def __call__(self, x: torch.Tensor, prepared: Int4PackCPU) -> torch.Tensor:
        if type(prepared) is not Int4PackCPU:
            raise KernelInputError(
                f"prepared: expected the Int4PackCPU that {self.name}.prepare returns, got {type(prepared).__name__}"
            )
        k = prepared.in_features
        if x.dtype not in ACT_DTYPES or x.device.type != "cpu" or x.dim() < 1 or x.shape[-1] != k:
            raise KernelInputError(f"x: expected [..., {k}] bf16/fp16/fp32 on cpu, got {describe(x)}")
        scales_offsets, bias = prepared.for_dtype(x.dtype)
        x2 = x.reshape(-1, k)
        if prepared.ret_idx is not None:
            x2 = x2.index_select(1, prepared.ret_idx)
        elif not x2.is_contiguous():
            x2 = x2.contiguous()
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, prepared.weight, prepared.group_size, scales_offsets)
        if bias is not None:
            y.add_(bias)
        return y.view(*x.shape[:-1], prepared.out_features)
