"""``svdquant_torch``: ``act_quant_lora`` in plain PyTorch, on any device, both formats.

It is the op written the way one would without a fused kernel — a handful of
element-wise passes over x, then a separate matmul for the LoRA branch — so it is also
the *unfused* peer in the benchmark. Its arithmetic is its own, not the golden
reference's: fp8 scales through torch's ``float8_e4m3fn`` cast, E2M1 codes by counting
thresholds passed (the golden measures distances to the grid), INT4 codes by
``torch.round``; the matrix holds it to the same bytes.

The LoRA branch is ``x @ lora_down`` as a float32 matmul of the upcast operands
(cuBLAS SGEMM on CUDA): the products of fp16/bf16 operands are exact in float32 and
the sums IEEE-rounded. A tensor-core GEMM with float32 output
(``torch.mm(..., out_dtype=torch.float32)``) accumulates less exactly: on an H100 it
measured 1.2e-5 relative error against the float64 golden at N = 10240, outside the
float32 policy, so the reference-style backend does not take it.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from quantcore.cost import Cost
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.formats.svdquant.numerics import FP8_NAN_BITS, FP16_NAN_BITS, INT4_SCALE_FLOOR, fdiv
from quantcore.kernel import Requirements
from quantcore.kernels.svdquant.base import SVDQuantKernel, SVDQuantWeights, allocate_outputs
from quantcore.kernels.svdquant.cost import op_bytes, op_flops
from quantcore.ops.act_quant_lora import ActQuantLoraOutput
from quantcore.probe import Capabilities
from quantcore.problem import Problem

__all__ = ["TorchActQuantLora", "lora_down_fp32"]

#: E2M1 rounding thresholds on |x / s| and whether a tie there goes up (``>=``) or down.
E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def lora_down_fp32(x: torch.Tensor, lora_down: torch.Tensor) -> torch.Tensor:
    """``x @ lora_down`` accumulated and returned in float32 (IEEE float32 sums)."""
    return x.float() @ lora_down.float()


def _codes_nvfp4(v: torch.Tensor, bad: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s8 = fdiv(amax, 6.0).clamp(max=448.0).to(torch.float8_e4m3fn).float()
    s8 = torch.where(s8 == 0, torch.full_like(s8, 2.0**-9), s8)
    y = v / s8.unsqueeze(-1)
    a = y.abs()
    idx = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for t, up in E2M1_THRESHOLDS:
        idx += (a >= t) if up else (a > t)
    codes = idx | (torch.signbit(y).to(torch.uint8) << 3)
    codes = codes.masked_fill(bad.unsqueeze(-1), 0)
    bits = s8.to(torch.float8_e4m3fn).view(torch.uint8).masked_fill(bad, FP8_NAN_BITS)
    return codes, bits


def _codes_int4(v: torch.Tensor, bad: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r = fdiv(7.0, amax)
    q = torch.round(v * r.unsqueeze(-1)).clamp_(-8, 7)
    drop = (bad | torch.isinf(r)).unsqueeze(-1)
    codes = q.masked_fill(drop, 0).to(torch.int8).view(torch.uint8) & 0xF
    scale = fdiv(amax, 7.0).clamp(min=INT4_SCALE_FLOOR).to(torch.float16)
    bits = scale.view(torch.int16).masked_fill(bad, FP16_NAN_BITS)
    return codes, bits


class TorchActQuantLora(SVDQuantKernel):
    name: ClassVar[str] = "svdquant_torch"
    priority: ClassVar[int] = 10
    description: ClassVar[str] = "plain PyTorch: element-wise quantize passes, then a separate fp32-output matmul"
    requires: ClassVar[Requirements] = Requirements(device_types=frozenset({"cpu", "cuda", "xpu", "npu"}))

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # A dozen element-wise passes over x and its float32 copies: ~30× the fused kernel's
        # bytes for NVFP4, ~16× for INT4, at ~30 % of the copy bandwidth, and the fp32
        # LoRA-down matmul (benchmarks/results/nvidia-h100-80gb-hbm3/svdquant_prequant.json).
        fmt = problem.format
        passes = 30 if getattr(fmt, "fp4", True) else 16
        return Cost(passes * op_bytes(problem), op_flops(problem), 0.3, 0.06, 2 * passes,
                    "fit to benchmarks/results")

    def __call__(self, x: torch.Tensor, prepared: SVDQuantWeights) -> ActQuantLoraOutput:
        self.check_call(x, prepared)
        return self.forward(x, prepared)

    def forward(self, x: torch.Tensor, prepared: SVDQuantWeights) -> ActQuantLoraOutput:
        fmt = self.fmt
        assert isinstance(fmt, SVDQuantAct)
        m, n = x.shape
        qout, oscales, lora = allocate_outputs(fmt, m, n, prepared.r, x.device)
        v = x.float()
        if prepared.rsmooth is not None:
            v = v * prepared.rsmooth
        v = v.view(m, n // fmt.block, fmt.block)
        amax = v.abs().amax(dim=-1)
        bad = ~torch.isfinite(amax)
        codes, bits = (_codes_nvfp4 if fmt.fp4 else _codes_int4)(v, bad, amax)
        codes = codes.view(m, n)
        qout[:m] = codes[:, 0::2] | (codes[:, 1::2] << 4)
        qout[m:] = 0
        scale_bits = oscales.view(torch.uint8 if fmt.fp4 else torch.int16)
        scale_bits[:, :m] = bits.T
        scale_bits[:, m:] = 0
        if prepared.r:
            lora[:m] = lora_down_fp32(x, prepared.lora_down)
            lora[m:] = 0
        return ActQuantLoraOutput(qout, oscales, lora)
