"""AWQ → the layout of ``aten._weight_int4pack_mm_for_cpu``: GPTQModel's
``transform_cpu_awq``, step by step.

1. unpack AWQ's ``qweight`` / ``qzeros`` and undo the AWQ nibble order;
2. zero offsets ``(2^(bits−1) − izeros) · scales`` (the op computes ``(q − 8)·s + offset``);
3. repack the codes into GPTQ lanes along the input dim;
4. the GPTQ CPU transform (:mod:`quantcore.transforms.int4pack_cpu`) turns those into the op's uint8 int4pack;
5. the real AWQ scales and offsets are restored as ``scales_and_zeros``.

GPTQModel keeps the offsets in fp16; here they stay fp32 until the activation dtype is
known (the op wants ``scales_and_zeros`` in that dtype), which is the same for fp16
activations and exact for fp32 ones.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from quantcore.formats.awq import AWQ
from quantcore.transform import Transform
from quantcore.transforms.awq_gptq import AWQToGPTQ, gptq_format_for
from quantcore.transforms.int4pack_cpu import GPTQToInt4PackCPU, Int4PackCPU

__all__ = ["AWQToInt4PackCPU", "awq_zero_offsets"]


def awq_zero_offsets(izeros: torch.Tensor, scales: torch.Tensor, bits: int) -> torch.Tensor:
    """Float offsets ``(2^(bits−1) − z) · s`` so that ``(q − 2^(bits−1))·s + offset = (q − z)·s``."""
    return ((1 << (bits - 1)) - izeros.to(torch.float32)) * scales.to(torch.float32)


class AWQToInt4PackCPU(Transform[Mapping[str, torch.Tensor], Int4PackCPU]):
    name = "awq->int4pack_cpu"

    def __init__(self, fmt: AWQ) -> None:
        self.fmt = fmt

    def apply(self, src: Mapping[str, torch.Tensor]) -> Int4PackCPU:
        fmt = self.fmt
        dims = fmt.validate(src)
        gptq = AWQToGPTQ(fmt).apply(src)  # steps 1 and 3
        prepared = GPTQToInt4PackCPU(gptq_format_for(fmt)).apply(gptq)  # step 4
        # Steps 2 and 5: the AWQ metadata, from the AWQ tensors, repeated over the op's
        # sub-groups (AWQ groups are contiguous, so sub-group j lies in group j·sub // gs).
        scales = src["scales"].to(torch.float32)
        offsets = awq_zero_offsets(fmt.unpack_zeros(src), scales, fmt.bits)
        gs = fmt.effective_group_size(dims["K"])
        sub = torch.arange(0, dims["K"], prepared.group_size, device=scales.device) // gs
        prepared.scales_offsets = torch.stack([scales[sub], offsets[sub]], dim=-1).contiguous()
        prepared.by_dtype.clear()
        return prepared
