"""The ``turboquant_cutile`` kernel: input rotation as a small GEMM, then one fused cuTile
launch per pass (``tiles.py``).

Refused with a reason, never crashing, where cuTile cannot run: the probe marks
``cuda.tile`` unusable when the package is missing or its compiler ``tileiras`` is not
on PATH (docs/cutile.md), and cuTile 1.4+ targets compute capability 8.0+.
"""

from __future__ import annotations

from typing import Any, ClassVar

from quantcore.cost import Cost, linear_cost
from quantcore.kernel import Requirements
from quantcore.kernels.turboquant import FusedTurboQuantKernel
from quantcore.kernels.turboquant.cost import passes, rotation_flops, weight_bytes
from quantcore.probe import Capabilities
from quantcore.problem import Problem

__all__ = ["TurboQuantCuTile"]


class TurboQuantCuTile(FusedTurboQuantKernel):
    name: ClassVar[str] = "turboquant_cutile"
    priority: ClassVar[int] = 90
    description: ClassVar[str] = "TurboQuant fused unpack → lookup → mma → rescale in cuTile (cuda.tile)"
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda"}), min_capability=(8, 0), packages=("cuda.tile",)
    )

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # Measured eagerly only (benchmarks/results/turboquant-nvidia-h100-80gb-hbm3.md):
        # at M <= 16 on 4096-wide shapes about Triton's time, beyond 1.6-6.6x slower (its mma
        # tiles run at ~5 % of the matmul rate). Not yet timed under CUDA graphs: a measured
        # table for the device replaces this.
        n_pass = passes(problem)
        flops_scale = n_pass + rotation_flops(problem) / max(1, 2 * problem["M"] * problem["K"] * problem["N"])
        base = linear_cost(problem, weight_bytes(problem), bandwidth=0.25, compute=0.05, launches=2 * n_pass,
                           note="fit to an eager H100 run only")
        return Cost(base.bytes, base.flops * flops_scale, base.bandwidth, base.compute, base.launches, base.note)

    def fused_pass(self) -> Any:
        from .tiles import fused_pass

        return fused_pass
