"""TurboQuant linears on this backend's kernels: the layer's passes laid out as one code
matrix into its codebook (``turboquant_layout.py``), x rotated by one GEMM, one launch of
the decode or the wgmma kernel with the codebook operand (``codebook.py``), README.md
"TurboQuant on this backend's kernels"."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from quantcore.cost import Cost, linear_cost, weight_fill
from quantcore.dtypes import dtype_name
from quantcore.errors import KernelInputError
from quantcore.formats.turboquant import TurboQuant
from quantcore.kernel import LinearKernel, Requirements, Support
from quantcore.kernels.turboquant.base import turboquant_support
from quantcore.kernels.turboquant.cost import passes, rotation_flops, weight_bytes
from quantcore.probe import Capabilities
from quantcore.problem import Problem
from quantcore.tensors import stored_on
from quantcore.triton.checks import check_x

from .kernel import HopperWgmmaGPTQ
from .turboquant_layout import TurboQuantHopperWeights, TurboQuantToHopper, layout_refusal

__all__ = ["HopperWgmmaTurboQuant"]

ACT_DTYPES = (torch.bfloat16, torch.float16)


class HopperWgmmaTurboQuant(LinearKernel):
    name: ClassVar[str] = "hopper_wgmma"
    format: ClassVar[str] = "turboquant"
    #: Below turboquant_triton (100): the declared costs decide, the priority breaks ties.
    priority: ClassVar[int] = 90
    description: ClassVar[str] = ("TurboQuant on Hopper: every pass in one launch of the decode or wgmma kernel, "
                                  "the codebook in shared memory; batches of 2 to 128 rows")
    requires: ClassVar[Requirements] = HopperWgmmaGPTQ.requires  # the same Gluon kernels

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        base = turboquant_support(problem, ACT_DTYPES)
        refused = layout_refusal(problem.format) if base else None  # type: ignore[arg-type]
        return Support.no(refused) if refused else base

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # Fit to the H200 (benchmarks/results/probes/turboquant_hopper-*-nvidia-h200.json, CUDA
        # graphs, the rotation GEMM included, beside turboquant_triton's declared costs): one
        # row streams the codes at ~1.3 TB/s (turboquant_triton's decode kernel 1.6), 8 rows at
        # ~1.3-1.4 TB/s where turboquant_triton's tensor-core kernel takes 1.1-1.2; up to 128
        # rows the multiply runs at ~0.56 of the bf16 matmul rate on the large layers, less on
        # smaller ones (weight_fill, as the GPTQ kernel's); above 128 rows the wgmma kernel
        # lost to turboquant_triton's dequantize + cuBLAS on two of three layers.
        m, n_pass = problem["M"], passes(problem)
        gemm = 2 * m * problem["K"] * problem["N"]
        flops_scale = n_pass + rotation_flops(problem) / max(1, gemm)
        if caps.device_type != "cuda":
            return linear_cost(problem, weight_bytes(problem), bandwidth=1e-3, compute=1e-3,
                               note="no GPU: never chosen")
        if m == 1:
            stream, compute = 1.3e12, 0.5
        elif m <= 128:
            stream, compute = 1.4e12, 0.56 * weight_fill(problem["K"], problem["N"]) ** 0.5
        else:
            stream, compute = 1.4e12, 0.3
        base = linear_cost(problem, weight_bytes(problem), bandwidth=0.5, compute=compute, launches=2,
                           stream_bytes_per_s=stream, note="fit to the H200's turboquant_hopper probe runs")
        return Cost(base.bytes, base.flops * flops_scale, base.bandwidth, base.compute, base.launches, base.note,
                    base.stream_bytes_per_s)

    def prepare(self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
                ) -> TurboQuantHopperWeights:
        fmt = self.fmt
        assert isinstance(fmt, TurboQuant)
        if dtype is not None and dtype not in ACT_DTYPES:
            names = ", ".join(dtype_name(d) for d in ACT_DTYPES)
            raise KernelInputError(f"dtype: expected {names}, got {dtype}")
        return TurboQuantToHopper(fmt).apply(stored_on(tensors, self.device, where=f"{self.name} prepare"))

    def stored_tensors(self, prepared: TurboQuantHopperWeights) -> dict[str, torch.Tensor]:
        """The format's tensors, bit for bit and in their stored dtypes (the layout's inverse)."""
        return TurboQuantToHopper(self.fmt).invert(prepared)  # type: ignore[arg-type]

    def __call__(self, x: torch.Tensor, prepared: TurboQuantHopperWeights) -> torch.Tensor:
        if type(prepared) is not TurboQuantHopperWeights:
            raise KernelInputError(f"prepared: expected the TurboQuantHopperWeights that {self.name}.prepare "
                                   f"returns, got {type(prepared).__name__}")
        check_x(x, prepared.layer_in_features, ACT_DTYPES, prepared.qweight.device)
        if x.numel() == 0:
            return x.new_empty(*x.shape[:-1], prepared.out_features)
        return _launcher()(x, prepared)


@functools.cache
def _launcher() -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """``turboquant_launch.turboquant_linear``, imported on the first call (it imports triton)."""
    from .turboquant_launch import turboquant_linear

    return turboquant_linear
