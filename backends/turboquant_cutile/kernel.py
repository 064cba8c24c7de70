"""The ``turboquant_cutile`` kernel: input rotation as a small GEMM, then one fused cuTile
launch per pass (``tiles.py``).

Refused with a reason, never crashing, where cuTile cannot run: the probe marks
``cuda.tile`` unusable when the package is missing or its compiler ``tileiras`` is not
on PATH (notes/cutile-on-h100.md), and cuTile 1.4+ targets compute capability 8.0+.
"""

from __future__ import annotations

from typing import Any, ClassVar

from quantcore.backends.turboquant_fused import FusedTurboQuantKernel
from quantcore.kernel import Requirements

__all__ = ["TurboQuantCuTile"]


class TurboQuantCuTile(FusedTurboQuantKernel):
    name: ClassVar[str] = "turboquant_cutile"
    priority: ClassVar[int] = 90
    description: ClassVar[str] = "TurboQuant fused unpack → lookup → mma → rescale in cuTile (cuda.tile)"
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda"}), min_capability=(8, 0), packages=("cuda.tile",)
    )

    def fused_pass(self) -> Any:
        from .tiles import fused_pass

        return fused_pass
