"""The ``awq_cpu`` kernel: AWQ checkpoints on ``aten._weight_int4pack_mm_for_cpu``.

After its transform the prepared state is aten_cpu's, so the call is aten_cpu's too;
what differs is the format it accepts and the way there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from quantcore.backends.aten_cpu.kernel import ACT_DTYPES, AtenCpuGPTQ
from quantcore.backends.aten_cpu.transform import Int4PackCPU
from quantcore.errors import KernelInputError
from quantcore.formats.awq import AWQ
from quantcore.kernel import Support
from quantcore.problem import Problem
from quantcore.transforms.awq_gptq import gptq_format_for

from .transform import AWQToInt4PackCPU

__all__ = ["AwqCpu"]


class AwqCpu(AtenCpuGPTQ):
    name: ClassVar[str] = "awq_cpu"
    format: ClassVar[str] = "awq"
    description: ClassVar[str] = "AWQ 4-bit via GPTQ lanes and aten._weight_int4pack_mm_for_cpu"

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        fmt = problem.format
        if not isinstance(fmt, AWQ):
            return Support.no(f"format {fmt.slug} is not AWQ")
        # The same op after the same repack: GPTQ's limits are AWQ's.
        return AtenCpuGPTQ.supports(Problem.of(gptq_format_for(fmt), dict(problem.dims), problem.act_dtype))

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> Int4PackCPU:
        prepared = AWQToInt4PackCPU(self.fmt).apply(tensors)  # type: ignore[arg-type]
        if dtype is not None:
            if dtype not in ACT_DTYPES:
                raise KernelInputError(f"dtype: expected bf16, fp16 or fp32, got {dtype}")
            prepared.for_dtype(dtype)
        return prepared
