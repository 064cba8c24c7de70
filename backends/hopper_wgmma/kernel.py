"""The ``hopper_wgmma`` kernels: GPTQ (4/8-bit) and AWQ (4-bit) linears on Hopper (sm_90)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from quantcore.cost import Cost, column_fill, linear_cost, weight_fill
from quantcore.formats.gptq import GPTQ
from quantcore.kernel import Requirements, Support
from quantcore.kernels.gptq_pairs.kernel import (
    ACT_DTYPES,
    AWQViaGPTQLanes,
    PairedGPTQKernel,
    code_bits,
    weight_bytes,
)
from quantcore.kernels.gptq_pairs.layout import SLICE, block_k
from quantcore.probe import Capabilities
from quantcore.problem import Problem
from quantcore.triton import GLUON_BELOW, TESTED_TRITON

from .layout import GPTQToHopper, HopperWeights

__all__ = ["ACT_DTYPES", "HopperWgmmaAWQ", "HopperWgmmaGPTQ"]


class HopperWgmmaGPTQ(PairedGPTQKernel):
    name: ClassVar[str] = "hopper_wgmma"
    #: Above triton_int4 (110) on sm_90; the declared costs decide (``cost``), the priority
    #: only breaks ties.
    priority: ClassVar[int] = 120
    description: ClassVar[str] = ("GPTQ 4/8-bit on Hopper in Gluon: TMA ring, dequantized operand in registers, "
                                  "async wgmma, split-K")
    #: wgmma and TMA: sm_90a only (Gluon compiles it for that target; no interpreter).
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda"}), min_capability=(9, 0), max_capability=(9, 0), packages=("triton",),
        min_versions=(TESTED_TRITON,), below_versions=(GLUON_BELOW,)
    )
    transform = GPTQToHopper
    prepared_type = HopperWeights

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # Fit to benchmarks/results/nvidia-h100-80gb-hbm3/{gptq,awq}_linear.json and
        # benchmarks/results/nvidia-h200/{gptq,awq,gptq8}_linear.json (CUDA graphs), beside the
        # declared costs of triton_int4, aten_cuda and cuBLAS (torch_fallback). To M ≈ 32 the
        # TMA ring streams the large weights at 1.9–2.8 TB/s on both cards, 4- and 8-bit alike
        # (a block is 64 bytes a row at either width, so as many bytes are in flight): a rate,
        # not a share, as the H200's faster memory does not raise it. At M ≤ 2 the split-K
        # pass and its reduction cost a launch more than tinygemm's single GEMV (4-bit only: at
        # 8 bits, where tinygemm does not run, the tables' M = 1 plans beat triton_int4 on both
        # cards: gptq8_linear.json). The multiply
        # reaches ~45 % of the bf16 matmul rate on the large shapes to M = 64; at M = 128
        # 0.80–0.84 / 0.60 / 0.40–0.42 / 0.13 of it at 4096×14336 / 14336×4096 / 4096² /
        # 4096×1024 on both cards (weight_fill); from M = 512 0.75, half at N = 1024
        # (column_fill); at M = 2048 0.85–1.05 on every 4-bit shape, ahead of triton_int4's
        # dequantize + cuBLAS where the dense weight is large (its write costs 10 %); at M = 8192
        # 0.80–0.93, where triton_int4's dequantize + cuBLAS is faster. 8-bit
        # codes dequantize through fp32 in bf16 (README.md): 0.65 of the 4-bit rate, 0.8 at
        # M = 128 where the H100's table runs the producer-warp plans (gptq8_linear.json),
        # and the 4-bit rate at M = 2048, where the producer-warp plans reach 0.87–0.97 on
        # the large shapes on both cards.
        m = problem["M"]
        weight = weight_bytes(problem)
        if caps.device_type != "cuda":
            return linear_cost(problem, weight, bandwidth=1e-3, compute=1e-3, note="no GPU: never chosen")
        k, n = problem["K"], problem["N"]
        if m <= 64:
            compute = 0.45
        elif m <= 256:
            compute = 0.75 * weight_fill(k, n)
        elif m <= 1024:
            compute = 0.75 * column_fill(n)
        elif m <= 2048:
            compute = 0.9 * column_fill(n)
        else:
            compute = 0.65 * column_fill(n)
        if code_bits(problem) == 8 and problem.act_dtype == torch.bfloat16 and not 1024 < m <= 2048:
            compute *= 0.8 if 64 < m <= 256 else 0.65
        launches = 2 if m <= 2 and code_bits(problem) == 4 else 1
        return linear_cost(problem, weight, bandwidth=0.8, compute=compute, launches=launches,
                           stream_bytes_per_s=2.4e12,
                           note="fit to benchmarks/results/nvidia-h100-80gb-hbm3 and nvidia-h200")

    @classmethod
    def layout_supports(cls, fmt: GPTQ, problem: Problem) -> Support:
        bk = block_k(fmt.bits)
        gs = fmt.group_size
        if gs != -1 and not (gs % bk == 0 or (bk % gs == 0 and gs % SLICE == 0)):
            return Support.no(
                f"group_size={gs}: hopper_wgmma fetches scales per {bk}-input block, so groups must divide "
                f"the block (and be multiples of {SLICE}) or be multiples of it (or -1)"
            )
        return Support.yes()

    @staticmethod
    @functools.cache
    def launcher() -> Callable[[torch.Tensor, Any], torch.Tensor]:
        """``launch.linear``, imported on the first call (it imports triton)."""
        from .launch import linear

        return linear

    def gated(self, x: torch.Tensor, prepared: Any, activation: str) -> torch.Tensor | None:
        """SiLU's gated end (``launch.gated_linear``) where the call's plan takes it, for an
        eager call: what it saves is a launch's host time (on an H200 a gate/up layer's call
        and the activation's cost the host 46-54 µs, the gated call 24-31, ``nn.Linear``
        27-32), while on the GPU it runs 0-1.1 µs slower than the two launches at M = 1 and
        16 (``benchmarks/results/probes/gated_end-wide-end-nvidia-h200.json``). A call being
        captured into a CUDA graph, replayed later without host work, and a plan that cannot
        end gated take the two launches, here (one check of x, one lookup of the plan)."""
        if activation != "silu":
            return None
        x = self.launch_input(x, prepared)
        if not x.numel():
            return None
        capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
        return _gated_launcher()(x, prepared, fuse=not capturing)


class HopperWgmmaAWQ(AWQViaGPTQLanes, HopperWgmmaGPTQ):
    description: ClassVar[str] = "AWQ 4-bit via GPTQ lanes and hopper_wgmma"


@functools.cache
def _gated_launcher() -> Callable[..., torch.Tensor]:
    """``launch.gated_linear``, imported on the first call (it imports triton)."""
    from .launch import gated_linear

    return gated_linear
