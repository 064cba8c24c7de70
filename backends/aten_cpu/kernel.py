"""The ``aten_cpu`` kernel: ``aten._weight_int4pack_mm_for_cpu`` behind GPTQ's contract."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from quantcore.kernels.int4pack_cpu import ACT_DTYPES, Int4PackCpuKernel
from quantcore.tensors import stored_on
from quantcore.transforms.int4pack_cpu import GPTQToInt4PackCPU, Int4PackCPU

__all__ = ["AtenCpuGPTQ"]


class AtenCpuGPTQ(Int4PackCpuKernel):
    name: ClassVar[str] = "aten_cpu"
    format: ClassVar[str] = "gptq"
    description: ClassVar[str] = "GPTQ 4-bit via aten._weight_int4pack_mm_for_cpu"

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> Int4PackCPU:
        tensors = stored_on(tensors, self.device, where=f"{self.name} prepare")
        return GPTQToInt4PackCPU(self.fmt).apply(tensors).ready_for(dtype, ACT_DTYPES)  # type: ignore[arg-type, return-value]
