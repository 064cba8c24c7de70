"""AWQ (GEMM layout) ↔ GPTQ v2 lanes, losslessly.

The first half of GPTQModel's ``TorchFusedAwqQuantLinear.transform_cpu_awq``: unpack
AWQ's output-packed lanes, undo the AWQ nibble order, and repack the codes along the
*input* dim into GPTQ lanes, so any GPTQ kernel can run an AWQ checkpoint. Zero points
move across unchanged (v2 stores them as they are); scales are the same tensor.
AWQ has no act-order, so the GPTQ side has ``g_idx = i // group_size``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import UnsupportedProblemError
from ..formats.awq import AWQ, pack_awq
from ..formats.gptq import GPTQ
from ..formats.packing import pack_codes
from ..transform import Transform

__all__ = ["AWQToGPTQ", "gptq_format_for"]

Tensors = Mapping[str, torch.Tensor]


def gptq_format_for(fmt: AWQ) -> GPTQ:
    """The GPTQ parameterisation that stores the same numbers as ``fmt``. AWQ without
    zero points stores every zero as 8, which is GPTQ's symmetric case."""
    return GPTQ(bits=fmt.bits, group_size=fmt.group_size, sym=not fmt.zero_point, checkpoint_format="v2")


class AWQToGPTQ(Transform[Tensors, dict[str, torch.Tensor]]):
    name = "awq->gptq"

    def __init__(self, fmt: AWQ) -> None:
        self.fmt = fmt
        self.target = gptq_format_for(fmt)

    def apply(self, src: Tensors) -> dict[str, torch.Tensor]:
        dims = self.fmt.validate(src)
        per_lane = 32 // self.fmt.bits
        if dims["K"] % per_lane:
            raise UnsupportedProblemError(
                f"qweight: in_features = {dims['K']} (qweight.shape[0]): GPTQ lanes pack "
                f"{per_lane} inputs per int32, so it must be a multiple of {per_lane}"
            )
        codes = self.fmt.unpack_weight(src)  # [I, O]
        zeros = self.fmt.unpack_zeros(src)  # [G, O]
        gs = self.fmt.effective_group_size(dims["K"])
        out = {
            "qweight": pack_codes(codes, self.fmt.bits, dim=0),
            "qzeros": pack_codes(zeros, self.fmt.bits, dim=1),
            "scales": src["scales"],
            "g_idx": (torch.arange(dims["K"], device=codes.device) // gs).to(torch.int32),
        }
        if "bias" in src:
            out["bias"] = src["bias"]
        return out

    def invert(self, dst: Tensors) -> dict[str, torch.Tensor]:
        self.target.validate(dst)
        out = {
            "qweight": pack_awq(self.target.unpack_weight(dst)),
            "qzeros": pack_awq(self.target.unpack_zeros(dst)),
            "scales": dst["scales"],
        }
        if "bias" in dst:
            out["bias"] = dst["bias"]
        return out
