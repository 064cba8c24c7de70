"""``act_quant_lora``: the SVDQuant W4A4 pre-GEMM (seeds/svdquant-w4a4-prequant-lora.md).

From the activation ``x [M, N]`` (fp16/bf16) of an SVDQuant linear, ``lora_down
[N, R]`` and an optional ``smooth [N]``, one call produces::

    qout          [M_pad, N/2] uint8    4-bit codes of x / smooth (NVFP4 or INT4)
    oscales       [N/B, M_pad]          block scales (fp8 e4m3, B = 16 | fp16, B = 64)
    lora_act_out  [M_pad, R] float32    x @ lora_down, on the raw x

with ``M_pad`` = M rounded up to the format's ``pad_size`` (256). The rules, down to
tie-breaking, padding and non-finite inputs, are the format's
(:mod:`quantcore.formats.svdquant.format`). It is not a linear map, so its golden
reference has two parts: codes and scales that every kernel must reproduce bit for bit
(the format's golden quantizer, exact float32), and the LoRA branch in float64, which a
kernel must match within float32 accumulation error.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar, NamedTuple

import torch

from ..errors import KernelInputError
from ..formats.svdquant import SVDQuantAct
from ..kernel import Kernel
from ..problem import Problem
from ..tensors import describe
from .base import Op

__all__ = [
    "ACT_DTYPES",
    "ACT_QUANT_LORA",
    "ActQuantLoraKernel",
    "ActQuantLoraOutput",
    "act_quant_lora_problem",
    "act_quant_lora_reference",
    "check_activation",
]

ACT_QUANT_LORA = Op(
    name="act_quant_lora",
    dims=("M", "N", "R"),
    doc="qout, oscales = quantize(x / smooth) (NVFP4 or INT4, M padded); lora_act_out = x @ lora_down (fp32)",
    may_be_zero=("R",),
)

ACT_DTYPES = (torch.float16, torch.bfloat16)


class ActQuantLoraOutput(NamedTuple):
    qout: torch.Tensor  # [M_pad, N/2] uint8
    oscales: torch.Tensor  # [N/B, M_pad] float8_e4m3fn or float16
    lora_act_out: torch.Tensor  # [M_pad, R] float32 (float64 in the golden reference)


def act_quant_lora_problem(
    format: SVDQuantAct, *, M: int, N: int, R: int, dtype: torch.dtype = torch.bfloat16
) -> Problem:
    return Problem.of(format, {"M": M, "N": N, "R": R}, dtype, op="act_quant_lora")


def act_quant_lora_reference(
    fmt: SVDQuantAct, x: torch.Tensor, lora_down: torch.Tensor, smooth: torch.Tensor | None = None
) -> ActQuantLoraOutput:
    """The golden outputs: codes and scales from the format's golden quantizer, and
    ``x @ lora_down`` in float64 with ``lora_down`` rounded to x's dtype, as kernels use
    it; padding rows zero."""
    codes = fmt.quantize(x, smooth=smooth)
    m, m_pad = x.shape[0], codes["qout"].shape[0]
    lora = torch.zeros(m_pad, lora_down.shape[1], dtype=torch.float64, device=x.device)
    lora[:m] = x.double() @ lora_down.to(x.dtype).double()
    return ActQuantLoraOutput(codes["qout"], codes["oscales"], lora)


def check_activation(x: object, *, n: int, dtype: torch.dtype, device: torch.device) -> int:
    """``x`` must be ``[M, N]`` in the dtype the kernel was prepared for, on its device;
    returns M."""
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[1] != n or x.dtype != dtype or x.device != device:
        name = str(dtype).removeprefix("torch.")
        raise KernelInputError(f"x: expected [M, {n}] {name} on {device}, got {describe(x)}")
    return int(x.shape[0])


class ActQuantLoraKernel(Kernel):
    """Runs ``act_quant_lora`` for the ``svdquant`` format; see the module docstring."""

    op: ClassVar[str] = "act_quant_lora"

    @abstractmethod
    def __call__(self, x: torch.Tensor, prepared: Any) -> ActQuantLoraOutput: ...
