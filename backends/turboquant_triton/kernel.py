"""The ``turboquant_triton`` kernel: input rotation as a small GEMM, then one fused launch
per pass (``fused.py``)."""

from __future__ import annotations

from typing import ClassVar

import torch

from quantcore.formats.turboquant.runtime import (
    PassData,
    TurboQuantLinearKernel,
    TurboQuantPrepared,
    rotate_input,
)
from quantcore.kernel import Requirements, Support
from quantcore.probe import Capabilities
from quantcore.problem import Problem

__all__ = ["FUSED_GROUP_SIZES", "TurboQuantTriton"]

#: d/2 is a block dimension of the fused kernels (a power of two, at least 16 for tl.dot).
FUSED_GROUP_SIZES = (32, 64, 128, 256)


class TurboQuantTriton(TurboQuantLinearKernel):
    name: ClassVar[str] = "turboquant_triton"
    priority: ClassVar[int] = 100
    description: ClassVar[str] = "TurboQuant fused unpack → lookup → dot → rescale in Triton"
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda", "cpu"}), packages=("triton",)
    )
    split_halves: ClassVar[bool] = True

    @classmethod
    def priority_on(cls, caps: Capabilities) -> int:
        # On CPU this is Triton's interpreter: a correctness tool, far slower than torch.
        return 10 if caps.device_type == "cpu" else cls.priority

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        base = super().supports(problem)
        if not base:
            return base
        d = problem.format.group_size  # type: ignore[attr-defined]
        if d not in FUSED_GROUP_SIZES:
            return Support.no(f"group_size={d}: the fused kernel takes {'/'.join(map(str, FUSED_GROUP_SIZES))}")
        return Support.yes()

    def run_pass(
        self,
        x2d: torch.Tensor,
        data: PassData,
        prepared: TurboQuantPrepared,
        *,
        partial: torch.Tensor | None,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        from .fused import fused_pass

        x_rot = rotate_input(x2d, data.rotation)
        return fused_pass(
            x_rot, data.indices, data.scales, prepared.codebook,
            group_size=prepared.group_size, partial=partial, bias=bias, out_dtype=out_dtype,
        )
