"""The ``turboquant_triton`` kernel: every pass of a layer in one fused launch, on the
path M calls for (``fused.py``: decode kernel, tensor-core kernel, or dequantize + cuBLAS).

Its passes are prepared in the natural coordinate order (``split_halves=False``): the
kernels read indices as int32 words, eight consecutive coordinates per word.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from quantcore.backends.turboquant_fused import FusedTurboQuantKernel
from quantcore.kernel import Requirements
from quantcore.nn.turboquant.kernel import PassData, TurboQuantPrepared
from quantcore.probe import Capabilities

__all__ = ["TurboQuantTriton"]


class TurboQuantTriton(FusedTurboQuantKernel):
    name: ClassVar[str] = "turboquant_triton"
    priority: ClassVar[int] = 100
    description: ClassVar[str] = (
        "TurboQuant in Triton: fused decode (M = 1) and tensor-core kernels, dequantize + cuBLAS for prefill"
    )
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda", "cpu"}), packages=("triton",)
    )
    split_halves: ClassVar[bool] = False

    @classmethod
    def priority_on(cls, caps: Capabilities) -> int:
        # On CPU this is Triton's interpreter: a correctness tool, far slower than torch.
        return 10 if caps.device_type == "cpu" else cls.priority

    def _launcher(self) -> Any:
        from .fused import fused_linear

        return fused_linear

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
        return self._launcher()(  # type: ignore[no-any-return]
            x2d, [data], prepared.codebook, group_size=prepared.group_size,
            partial=partial, bias=bias, out_dtype=out_dtype,
        )

    def run_passes(
        self,
        x2d: torch.Tensor,
        passes: Sequence[PassData],
        prepared: TurboQuantPrepared,
        *,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """Every pass in one launch (the passes share x and the output tile)."""
        return self._launcher()(  # type: ignore[no-any-return]
            x2d, list(passes), prepared.codebook, group_size=prepared.group_size,
            partial=None, bias=bias, out_dtype=out_dtype,
        )
