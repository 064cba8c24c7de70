"""The ``turboquant_triton`` kernel: input rotation as a small GEMM, then one fused launch
per pass (``fused.py``)."""

from __future__ import annotations

from typing import Any, ClassVar

from quantcore.backends.turboquant_fused import FusedTurboQuantKernel
from quantcore.backends.turboquant_fused.cost import passes, rotation_flops, weight_bytes
from quantcore.cost import Cost, linear_cost
from quantcore.kernel import Requirements
from quantcore.probe import Capabilities
from quantcore.problem import Problem

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

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # benchmarks/results/nvidia-h100-80gb-hbm3/turboquant_linear.json (CUDA graphs): the
        # M = 1 GEMV streams at ~33 % of the copy bandwidth; the GEMM (M > 1) at ~12 %, and
        # multiplies at ~15 % of the bf16 matmul rate below M = 512, ~33 % from there.
        # Two launches a pass (the rotation GEMM, the fused kernel). On a CPU this is
        # Triton's interpreter: thousands of times slower than torch.
        m, n_pass = problem["M"], passes(problem)
        flops_scale = n_pass + rotation_flops(problem) / max(1, 2 * m * problem["K"] * problem["N"])
        if caps.device_type == "cpu":
            shares = {"bandwidth": 2e-4, "compute": 2e-4}
        elif m == 1:
            shares = {"bandwidth": 0.33, "compute": 0.33}
        else:
            shares = {"bandwidth": 0.12, "compute": 0.33 if m >= 512 else 0.15}
        base = linear_cost(problem, weight_bytes(problem), launches=2 * n_pass, **shares,
                           note="Triton interpreter" if caps.device_type == "cpu" else "fit to nvidia-h100 results")
        return Cost(base.bytes, base.flops * flops_scale, base.bandwidth, base.compute, base.launches, base.note)

    def fused_pass(self) -> Any:
        from .fused import fused_pass

        return fused_pass
