"""The ``turboquant_cutile`` kernel: per pass, the input rotation as a small GEMM, then one
fused cuTile launch; from ``plan.DEQUANT_FROM_M`` rows (and below, where the matrix-unit
kernel would not fill the GPU), every pass dequantized by cuTile and one cuBLAS GEMM
(``plan.py``, ``tiles.py``).

Refused with a reason, never crashing, where cuTile cannot run: the probe marks
``cuda.tile`` unusable when the package is missing or its compiler ``tileiras`` is not
on PATH (docs/cutile.md), and cuTile 1.4+ targets compute capability 8.0+.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from quantcore.cost import Cost, linear_cost
from quantcore.kernel import Requirements
from quantcore.kernels.turboquant import FusedTurboQuantKernel
from quantcore.kernels.turboquant.base import PassData, TurboQuantPrepared
from quantcore.kernels.turboquant.cost import passes, rotation_flops, weight_bytes
from quantcore.probe import Capabilities
from quantcore.problem import Problem

from . import plan

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
        # Fit to the H200's CUDA-graph run (benchmarks/results/probes/turboquant_cutile_paths-
        # nvidia-h200.json): the GEMV (M = 1) streams the weight at ~0.36 TB/s and the matrix-unit
        # kernel (M < plan.DEQUANT_FROM_M) at ~0.2 TB/s — every codebook lookup is a gather
        # through L1, cuTile having no shared-memory table — and from there dequantize + cuBLAS
        # multiplies at ~0.2 (M = 128) to ~0.5 (M = 2048) of the bf16 matmul rate.
        m, n_pass = problem["M"], passes(problem)
        flops_scale = n_pass + rotation_flops(problem) / max(1, 2 * m * problem["K"] * problem["N"])
        stream = 0.36e12 if m == 1 else 0.2e12 if m < plan.DEQUANT_FROM_M else math.inf
        compute = 0.05 if m < plan.DEQUANT_FROM_M else 0.2 if m < 512 else 0.5
        base = linear_cost(problem, weight_bytes(problem), bandwidth=0.4, compute=compute,
                           launches=2 * n_pass, stream_bytes_per_s=stream, note="fit to an H200 CUDA-graph run")
        return Cost(base.bytes, base.flops * flops_scale, base.bandwidth, base.compute, base.launches, base.note,
                    base.stream_bytes_per_s)

    def fused_pass(self) -> Any:
        from .tiles import fused_pass

        return fused_pass

    def run_passes(
        self,
        x2d: torch.Tensor,
        passes: Sequence[PassData],
        prepared: TurboQuantPrepared,
        *,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        if not plan.dense(x2d.shape[0], prepared.out_features, _sms(x2d.device)):
            return super().run_passes(x2d, passes, prepared, bias=bias, out_dtype=out_dtype)
        from . import tiles

        return tiles.dense_passes(x2d, passes, prepared.codebook, group_size=prepared.group_size, bias=bias,
                                  out_dtype=out_dtype)


@functools.cache
def _sms(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)
