"""The fused TurboQuant kernels' base: per pass, the input rotation (a small GEMM), then
one fused launch that unpacks, looks up, multiplies and rescales. The pass contract it
implements is :class:`.base.TurboQuantLinearKernel`'s."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ...kernel import Support
from ...problem import Problem
from .base import PassData, TurboQuantLinearKernel, TurboQuantPrepared, rotate_input

__all__ = ["FusedTurboQuantKernel"]


class FusedTurboQuantKernel(TurboQuantLinearKernel):
    """A kernel whose pass is the input rotation (a GEMM) then one fused launch
    ``fused_pass(x_rot, indices, scales, codebook, ...)`` — the Triton and cuTile backends.
    Their tiles take half a group per step, so d/2 must be a power of two, 16 or more."""

    split_halves: ClassVar[bool] = True
    FUSED_GROUP_SIZES: ClassVar[tuple[int, ...]] = (32, 64, 128, 256)

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        base = super().supports(problem)
        if not base:
            return base
        d = problem.format.group_size  # type: ignore[attr-defined]
        if d not in cls.FUSED_GROUP_SIZES:
            sizes = "/".join(map(str, cls.FUSED_GROUP_SIZES))
            return Support.no(f"group_size={d}: the fused kernel takes {sizes}")
        return Support.yes()

    def fused_pass(self) -> Any:
        """The launcher, imported on first use (its module imports triton or cuda.tile)."""
        raise NotImplementedError

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
        x_rot = rotate_input(x2d, data.rotation)
        return self.fused_pass()(  # type: ignore[no-any-return]
            x_rot, data.indices, data.scales, prepared.codebook,
            group_size=prepared.group_size, partial=partial, bias=bias, out_dtype=out_dtype,
        )
