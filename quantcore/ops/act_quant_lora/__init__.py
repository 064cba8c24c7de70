"""``act_quant_lora``: the SVDQuant W4A4 pre-GEMM.

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

from collections.abc import Mapping

import torch

from ...formats.svdquant import SVDQuantAct
from ...problem import Problem
from ..op import Op
from .harness import HARNESS
from .kernel import ACT_DTYPES, ActQuantLoraKernel, check_activation
from .reference import ActQuantLoraOutput, act_quant_lora_reference

__all__ = [
    "ACT_DTYPES",
    "OP",
    "ActQuantLoraKernel",
    "ActQuantLoraOutput",
    "act_quant_lora_problem",
    "act_quant_lora_reference",
    "check_activation",
]


def _output(
    fmt: SVDQuantAct, dims: Mapping[str, int], x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m_pad = fmt.padded_rows(x.shape[0])
    n, rank = dims["N"], dims["R"]
    return (
        x.new_empty((m_pad, n // 2), dtype=torch.uint8),
        x.new_empty((n // fmt.block, m_pad), dtype=fmt.scale_dtype),
        x.new_empty((m_pad, rank), dtype=torch.float32),
    )


OP = Op(
    name="act_quant_lora",
    dims=("M", "N", "R"),
    weight_dims=("N", "R"),
    doc="qout, oscales = quantize(x / smooth) (NVFP4 or INT4, M padded); lora_act_out = x @ lora_down (fp32)",
    output=_output,
    result=ActQuantLoraOutput,
    harness=HARNESS,
    may_be_zero=("R",),
)


def act_quant_lora_problem(
    format: SVDQuantAct, *, M: int, N: int, R: int, dtype: torch.dtype = torch.bfloat16
) -> Problem:
    return Problem.of(format, {"M": M, "N": N, "R": R}, dtype, op="act_quant_lora")
