"""The ``turboquant_triton`` kernel: every pass of a layer in one fused launch, on the
path M calls for (``fused.py``: decode kernel, tensor-core kernel, or dequantize + cuBLAS).

Its passes are prepared in the natural coordinate order (``split_halves=False``): the
kernels read indices as int32 words, eight consecutive coordinates per word.
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
from quantcore.kernels.turboquant.base import ACT_DTYPES, PassData, TurboQuantPrepared
from quantcore.kernels.turboquant.cost import group_size, passes, rotation_flops, weight_bytes
from quantcore.probe import Capabilities
from quantcore.problem import Problem
from quantcore.triton import TESTED_TRITON
from quantcore.triton.checks import check_x

from .configs import PathChoice

__all__ = ["TurboQuantTriton"]


class TurboQuantTriton(FusedTurboQuantKernel):
    name: ClassVar[str] = "turboquant_triton"
    priority: ClassVar[int] = 100
    description: ClassVar[str] = (
        "TurboQuant in Triton: fused decode (M = 1) and tensor-core kernels, dequantize + cuBLAS for prefill"
    )
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda", "cpu"}), packages=("triton",),
        min_versions=(TESTED_TRITON,)
    )
    split_halves: ClassVar[bool] = False

    @classmethod
    def priority_on(cls, caps: Capabilities) -> int:
        # On CPU this is Triton's interpreter: a correctness tool, far slower than torch.
        return 10 if caps.device_type == "cpu" else cls.priority

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # Fit to both sm_90 cards' committed runs (benchmarks/results/<card>/turboquant_linear.json,
        # CUDA graphs): the M = 1 decode kernel (one launch, every pass) streams ~1.5 TB/s on
        # the large shapes and the tensor-core kernel (M ≤ 128, the rotation GEMM a second
        # launch a pass) ~1.2 TB/s, on the H100 and the H200 alike (issue- and latency-bound:
        # a rate, not a share of the copy bandwidth), and it multiplies at ~36 % of the bf16
        # matmul rate; above M = 128, dequantize + cuBLAS reaches ~33 % of the matmul rate at
        # M = 256 and ~75 % from M = 512. Where the rotations are folded into the weight
        # (configs.PathChoice) the GEMM is one pass deep, plus the fold's N·K·d per pass. On a
        # CPU this is Triton's interpreter: thousands of times slower than torch.
        m, n_pass = problem["M"], passes(problem)
        gemm = 2 * m * problem["K"] * problem["N"]
        if m > 128 and PathChoice().prefill_path(m, n_pass, group_size(problem)) == "fold":
            flops_scale, launches = 1 + rotation_flops(problem) * problem["N"] / m / max(1, gemm), 2
        else:
            flops_scale, launches = n_pass + rotation_flops(problem) / max(1, gemm), 1 if m == 1 else 2 * n_pass
        if caps.device_type == "cpu":
            shares = {"bandwidth": 2e-4, "compute": 2e-4}
        elif m == 1:
            shares = {"bandwidth": 0.5, "compute": 0.5}
        elif m <= 128:
            shares = {"bandwidth": 0.40, "compute": 0.36}
        else:
            shares = {"bandwidth": 0.40, "compute": 0.33 if m < 512 else 0.75}
        stream = 1.5e12 if m == 1 else 1.2e12 if m <= 128 else math.inf
        base = linear_cost(problem, weight_bytes(problem), launches=launches, **shares,
                           stream_bytes_per_s=stream if caps.device_type == "cuda" else math.inf,
                           note="Triton interpreter" if caps.device_type == "cpu" else "fit to sm_90 results")
        return Cost(base.bytes, base.flops * flops_scale, base.bandwidth, base.compute, base.launches, base.note,
                    base.stream_bytes_per_s)

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
        return _fused()(  # type: ignore[no-any-return]
            x2d, (data,), prepared.codebook, group_size=prepared.group_size,
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
        return _fused()(  # type: ignore[no-any-return]
            x2d, passes, prepared.codebook, group_size=prepared.group_size,
            partial=None, bias=bias, out_dtype=out_dtype,
        )

    def __call__(self, x: torch.Tensor, prepared: TurboQuantPrepared) -> torch.Tensor:
        """The base class's call with its checks made cheaply on the happy path."""
        if type(prepared) is not TurboQuantPrepared or prepared.split_halves != self.split_halves:
            self.check_input(x, prepared)  # raises, naming what is wrong
        k = prepared.in_features
        check_x(x, k, ACT_DTYPES, prepared.codebook.device)
        flat = x.dim() == 2
        # The layer's own passes: the bucket is remembered with the prepared state.
        out = _prepared()(x if flat else x.reshape(-1, k), prepared)
        return out if flat else out.view(*x.shape[:-1], prepared.out_features)


@functools.cache
def _fused() -> Any:
    """``fused.fused_linear``, imported on the first call (it imports triton)."""
    from .fused import fused_linear

    return fused_linear


@functools.cache
def _prepared() -> Any:
    """``fused.prepared_linear``, imported on the first call (it imports triton)."""
    from .fused import prepared_linear

    return prepared_linear
