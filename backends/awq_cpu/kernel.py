"""The ``awq_cpu`` kernel: AWQ checkpoints on ``aten._weight_int4pack_mm_for_cpu``.

After its transform the prepared state is the op's (the same as ``aten_cpu``'s), so the
call is the shared one (:mod:`quantcore.kernels.int4pack_cpu`); what differs is the
format it accepts and the way there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from quantcore.formats.awq import AWQ
from quantcore.kernel import Support
from quantcore.kernels.int4pack_cpu import ACT_DTYPES, Int4PackCpuKernel
from quantcore.problem import Problem
from quantcore.tensors import stored_on
from quantcore.transforms.awq_gptq import gptq_format_for
from quantcore.transforms.int4pack_cpu import Int4PackCPU

from .transform import AWQToInt4PackCPU

__all__ = ["AwqCpu"]


class AwqCpu(Int4PackCpuKernel):
    name: ClassVar[str] = "awq_cpu"
    format: ClassVar[str] = "awq"
    description: ClassVar[str] = "AWQ 4-bit via GPTQ lanes and aten._weight_int4pack_mm_for_cpu"

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        fmt = problem.format
        if not isinstance(fmt, AWQ):
            return Support.no(f"format {fmt.slug} is not AWQ")
        # The same op after the same repack: GPTQ's limits are AWQ's.
        return super().supports(Problem.of(gptq_format_for(fmt), dict(problem.dims), problem.act_dtype))

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> Int4PackCPU:
        tensors = stored_on(tensors, self.device, where=f"{self.name} prepare")
        return AWQToInt4PackCPU(self.fmt).apply(tensors).ready_for(dtype, ACT_DTYPES)  # type: ignore[arg-type, return-value]
