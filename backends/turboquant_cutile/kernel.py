"""The ``turboquant_cutile`` kernel: input rotation as a small GEMM, then one fused cuTile
launch per pass (``tiles.py``).

Refused with a reason, never crashing, where cuTile cannot run: the probe marks
``cuda.tile`` unusable when the package is missing or its compiler ``tileiras`` is not
on PATH (notes/cutile-on-h100.md), and cuTile 1.4+ targets compute capability 8.0+.
"""

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
from quantcore.problem import Problem

__all__ = ["TILE_GROUP_SIZES", "TurboQuantCuTile"]

#: d/2 is a tile dimension (a power of two; 16+ for the MMA).
TILE_GROUP_SIZES = (32, 64, 128, 256)


class TurboQuantCuTile(TurboQuantLinearKernel):
    name: ClassVar[str] = "turboquant_cutile"
    priority: ClassVar[int] = 90
    description: ClassVar[str] = "TurboQuant fused unpack → lookup → mma → rescale in cuTile (cuda.tile)"
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda"}), min_capability=(8, 0), packages=("cuda.tile",)
    )
    split_halves: ClassVar[bool] = True

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        base = super().supports(problem)
        if not base:
            return base
        d = problem.format.group_size  # type: ignore[attr-defined]
        if d not in TILE_GROUP_SIZES:
            return Support.no(f"group_size={d}: the cuTile kernel takes {'/'.join(map(str, TILE_GROUP_SIZES))}")
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
        from .tiles import fused_pass

        x_rot = rotate_input(x2d, data.rotation)
        return fused_pass(
            x_rot, data.indices, data.scales, prepared.codebook,
            group_size=prepared.group_size, partial=partial, bias=bias, out_dtype=out_dtype,
        )
