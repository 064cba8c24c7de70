"""``triton_nvfp4``: the SVDQuant pre-GEMM writing NVFP4 (E2M1 codes, fp8 e4m3 scales per
16) and the LoRA-down output in one Triton kernel (``quantcore.kernels.svdquant``).

CUDA (SM >= 8.0: the fp8 scale is rounded with integer operations, so no fp8 hardware
is needed to *produce* the format; its consumer is an SM100 scaled MMA), and Triton's
interpreter on CPU, where it ranks below plain torch.
"""

from __future__ import annotations

from typing import ClassVar

from quantcore.kernels.svdquant.triton_kernel import TritonActQuantLora
from quantcore.probe import Capabilities
from quantcore.registry import hookimpl

__all__ = ["TritonNVFP4"]


class TritonNVFP4(TritonActQuantLora):
    name: ClassVar[str] = "triton_nvfp4"
    fp4_only: ClassVar[bool | None] = True
    priority: ClassVar[int] = 50
    description: ClassVar[str] = "Triton: NVFP4 quantize + LoRA-down from one read of x (CUDA; interpreter on CPU)"

    @classmethod
    def priority_on(cls, caps: Capabilities) -> int:
        return cls.priority if caps.device_type == "cuda" else 1


@hookimpl
def quantcore_kernels() -> list[type]:
    return [TritonNVFP4]
