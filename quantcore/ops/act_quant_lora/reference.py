"""The golden ``act_quant_lora``: codes and scales from the format's golden quantizer,
the LoRA branch in float64 (the contract is in :mod:`quantcore.ops.act_quant_lora`)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...formats.svdquant import SVDQuantAct

__all__ = ["ActQuantLoraOutput", "act_quant_lora_reference"]


class ActQuantLoraOutput(NamedTuple):
    qout: torch.Tensor  # [M_pad, N/2] uint8
    oscales: torch.Tensor  # [N/B, M_pad] float8_e4m3fn or float16
    lora_act_out: torch.Tensor  # [M_pad, R] float32 (float64 in the golden reference)


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
