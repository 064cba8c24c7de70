"""compressed-tensors pack-quantized ↔ GPTQ v2, losslessly, so every GPTQ kernel runs it.

Both store the offset codes as a little-endian bit stream of b-bit fields in int32
lanes; they differ in orientation and in where the zero points live:

=====================  ==============================  ==============================
                       pack-quantized                  GPTQ v2
=====================  ==============================  ==============================
codes                  weight_packed [O, I·b/32]       qweight [I·b/32, O]
                       (packed along the inputs)       (packed along the inputs)
zero points            weight_zero_point [O·b/32, G]   qzeros [G, O·b/32]
                       (absent when symmetric: 2^(b−1))
scales                 weight_scale [O, G]             scales [G, O]
groups                 weight_g_idx [I] (act-order)    g_idx [I]
=====================  ==============================  ==============================

The stored fields are moved, never recomputed, so dequantization is the same float
arithmetic on the same numbers: ``(q − z) · s`` on both sides.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import TensorFormatError
from ..formats.compressed_tensors import CompressedTensors
from ..formats.gptq import GPTQ
from ..formats.packing import pack_codes
from ..transform import Transform

__all__ = ["CompressedToGPTQ", "gptq_format_for_compressed"]

Tensors = Mapping[str, torch.Tensor]


def gptq_format_for_compressed(fmt: CompressedTensors) -> GPTQ:
    """The GPTQ parameterisation that stores the same numbers as ``fmt``."""
    return GPTQ(bits=fmt.bits, group_size=fmt.group_size, sym=fmt.sym, desc_act=fmt.act_order,
                checkpoint_format="v2")


class CompressedToGPTQ(Transform[Tensors, dict[str, torch.Tensor]]):
    name = "compressed-tensors->gptq"

    def __init__(self, fmt: CompressedTensors) -> None:
        self.fmt = fmt
        self.target = gptq_format_for_compressed(fmt)

    def apply(self, src: Tensors) -> dict[str, torch.Tensor]:
        self.fmt.validate(src)
        bits = self.fmt.bits
        codes = self.fmt.unpack_weight(src)  # [O, I]
        zeros = self.fmt.unpack_zeros(src)  # [O, G]
        out = {
            "qweight": pack_codes(codes.T, bits, dim=0),
            "qzeros": pack_codes(zeros.T, bits, dim=1),
            "scales": src["weight_scale"].T.contiguous(),
            "g_idx": self.fmt.group_index(src).to(torch.int32),
        }
        if "bias" in src:
            out["bias"] = src["bias"]
        return out

    def invert(self, dst: Tensors) -> dict[str, torch.Tensor]:
        dims = self.target.validate(dst)
        bits = self.fmt.bits
        zeros = self.target.unpack_zeros(dst)  # [G, O]
        if self.fmt.sym and not bool((zeros == self.fmt.offset).all()):
            raise TensorFormatError(
                f"{self.target.slug} tensors: qzeros: a symmetric {self.fmt.slug} weight has every zero point "
                f"{self.fmt.offset}; these hold others"
            )
        out = {
            "weight_packed": pack_codes(self.target.unpack_weight(dst).T, bits, dim=1),
            "weight_scale": dst["scales"].T.contiguous(),
            "weight_shape": torch.tensor([dims["N"], dims["K"]], dtype=torch.int64, device=dst["scales"].device),
        }
        if not self.fmt.sym:
            out["weight_zero_point"] = pack_codes(zeros.T, bits, dim=0)
        if self.fmt.act_order:
            out["weight_g_idx"] = self.target.group_index(dst).to(torch.int32)
        if "bias" in dst:
            out["bias"] = dst["bias"]
        return out
