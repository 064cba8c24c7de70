"""The ``aten_cuda`` kernels: GPTQ and AWQ 4-bit through torch's tinygemm."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from quantcore.errors import KernelInputError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.kernel import LinearKernel, Requirements, Support
from quantcore.problem import Problem
from quantcore.tensors import describe
from quantcore.transforms.awq_gptq import AWQToGPTQ, gptq_format_for

from .transform import N_ALIGN, OP_GROUP_SIZES, GPTQToTinygemm, Int4PackCUDA, inner_k_tiles

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
        fmt = problem.format
        if not isinstance(fmt, GPTQ):
            return Support.no(f"format {fmt.slug} is not GPTQ")
        if fmt.bits != 4:
            return Support.no(f"bits={fmt.bits}: tinygemm takes 4-bit codes only")
        if problem.act_dtype not in ACT_DTYPES:
            return Support.no(f"activation dtype {problem.act_dtype}: tinygemm takes bf16 only")
        n, k = problem.get("N"), problem.get("K")
        if n is not None and n % N_ALIGN:
            return Support.no(f"N={n}: tinygemm needs N % {N_ALIGN} == 0")
        if k is not None and inner_k_tiles(k) is None:
            return Support.no(f"K={k}: tinygemm needs K % 32 == 0")
        gs = fmt.group_size if fmt.group_size != -1 else k
        if gs is not None and not any(gs % g == 0 for g in OP_GROUP_SIZES):
            return Support.no(f"group_size={fmt.group_size}: tinygemm takes groups of {'/'.join(map(str, OP_GROUP_SIZES))} and none divides it")
        return Support.yes()

    def _gptq(self, tensors: Mapping[str, torch.Tensor]) -> tuple[GPTQ, Mapping[str, torch.Tensor]]:
        return self.fmt, tensors  # type: ignore[return-value]

    def prepare(self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None) -> Int4PackCUDA:
        fmt, gptq = self._gptq(tensors)
        prepared = GPTQToTinygemm(fmt).apply(gptq)
        if dtype is not None:
            if dtype not in ACT_DTYPES:
                raise KernelInputError(f"dtype: tinygemm takes bf16, got {dtype}")
            prepared.for_dtype(dtype)
        return prepared

    def __call__(self, x: torch.Tensor, prepared: Int4PackCUDA) -> torch.Tensor:
        if type(prepared) is not Int4PackCUDA:
            raise KernelInputError(f"prepared: expected the Int4PackCUDA that {self.name}.prepare returns, got {type(prepared).__name__}")
        k = prepared.in_features
        if x.dtype not in ACT_DTYPES or x.device != prepared.weight.device or x.dim() < 1 or x.shape[-1] != k:
            raise KernelInputError(f"x: expected [..., {k}] bf16 on {prepared.weight.device}, got {describe(x)}")
        scales_offsets, bias = prepared.for_dtype(x.dtype)
        x2 = x.reshape(-1, k)
        x2 = x2.index_select(1, prepared.ret_idx) if prepared.ret_idx is not None else x2.contiguous()
        y = torch.ops.aten._weight_int4pack_mm(x2, prepared.weight, prepared.group_size, scales_offsets)
        if bias is not None:
            y = y + bias
        return y.view(*x.shape[:-1], prepared.out_features)


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
