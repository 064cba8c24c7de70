"""The ``turboquant_triton`` kernel: input rotation as a small GEMM, then one fused launch
per pass (``fused.py``)."""

from __future__ import annotations

from typing import Any, ClassVar

from quantcore.backends.turboquant_fused import FusedTurboQuantKernel
from quantcore.kernel import Requirements
from quantcore.probe import Capabilities

__all__ = ["TurboQuantTriton"]


class TurboQuantTriton(FusedTurboQuantKernel):
    name: ClassVar[str] = "turboquant_triton"
    priority: ClassVar[int] = 100
    description: ClassVar[str] = "TurboQuant fused unpack → lookup → dot → rescale in Triton"
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda", "cpu"}), packages=("triton",)
    )

    @classmethod
    def priority_on(cls, caps: Capabilities) -> int:
        # On CPU this is Triton's interpreter: a correctness tool, far slower than torch.
        return 10 if caps.device_type == "cpu" else cls.priority

    def fused_pass(self) -> Any:
        from .fused import fused_pass

        return fused_pass
