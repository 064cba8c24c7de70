"""The ``aten_xpu`` kernel: GPTQ 4-bit on Intel XPUs via the fused aten op."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from quantcore.cost import Cost
from quantcore.formats.gptq import GPTQ
from quantcore.kernel import LinearKernel, Requirements, Support
from quantcore.probe import Capabilities
from quantcore.problem import Problem
from quantcore.tensors import stored_on
from quantcore.transforms.packed import expect_prepared, int4pack_cost

from .transform import GPTQToInt4PackXPU, Int4PackXPU

__all__ = ["AtenXpuGPTQ", "fused_mm"]

#: The XPU op runs fp16 and bf16 (fp32 is accepted by the meta function, but callers
#: such as torchao and SGLang cast it to bf16 first; unverified on hardware here).
ACT_DTYPES = (torch.bfloat16, torch.float16)
OP = "_weight_int4pack_mm_with_scales_and_zeros"


def fused_mm(x: torch.Tensor, w: torch.Tensor, group_size: int, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """The op itself; a module attribute so a test can stand the contract emulation in."""
    return getattr(torch.ops.aten, OP)(x, w, group_size, scales, zeros)


class AtenXpuGPTQ(LinearKernel):
    name: ClassVar[str] = "aten_xpu"
    format: ClassVar[str] = "gptq"
    priority: ClassVar[int] = 100
    description: ClassVar[str] = f"GPTQ 4-bit via aten.{OP} (Intel XPU)"
    requires: ClassVar[Requirements] = Requirements(device_types=frozenset({"xpu"}), aten_ops=(OP,))

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        fmt = problem.format
        if not isinstance(fmt, GPTQ):
            return Support.no(f"format {fmt.slug} is not GPTQ")
        if fmt.bits != 4 or fmt.pack_dtype != torch.int32:
            return Support.no(f"{fmt.slug}: the op takes 4-bit codes in int32 lanes")
        if problem.act_dtype not in ACT_DTYPES:
            return Support.no(f"activation dtype {problem.act_dtype}: the XPU op takes bf16, fp16")
        k = problem.get("K")
        if k is not None and k % 8:
            return Support.no(f"K={k}: the op packs 8 inputs per int32 lane")
        return Support.yes()

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # Nothing measured on an XPU yet: the shares of the CUDA tinygemm op this one ports
        # (a GEMV-shaped int4 mm), so that with allow_dense a dense matmul takes over from
        # the same M. A measured table for the device replaces this.
        return int4pack_cost(problem, group_sizes=(problem.format.group_size if problem.format.group_size > 0  # type: ignore[attr-defined]
                                                   else problem["K"],), bandwidth=0.6, compute=0.04,
                             note="nominal: unmeasured on an XPU")

    def prepare(self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None) -> Int4PackXPU:
        tensors = stored_on(tensors, self.device, where=f"{self.name} prepare")
        return GPTQToInt4PackXPU(self.fmt).apply(tensors).ready_for(dtype, ACT_DTYPES)  # type: ignore[arg-type, return-value]

    def __call__(self, x: torch.Tensor, prepared: Int4PackXPU) -> torch.Tensor:
        expect_prepared(prepared, Int4PackXPU, self.name)
        return prepared.run(
            x, lambda x2, scales: fused_mm(x2, prepared.weight, prepared.group_size, scales, prepared.zeros), ACT_DTYPES
        )
