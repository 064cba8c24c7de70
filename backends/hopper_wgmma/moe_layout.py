"""The ``trtllm_moe`` format's experts in ``hopper_wgmma``'s prepared layout.

The format stores signed int8 codes ``q [E, K, N]`` and group scales, ``W = q · s``
(README.md of the format). Symmetric 8-bit GPTQ with zero point 128 holds the same weight
as the unsigned codes ``u = q + 128``: ``(u − 128) · s`` — so each expert goes through the
same row form (``GPTQRows``) and the same layout as a GPTQ linear, and one kernel reads
both. The asymmetric format adds a float zero after scaling, which no integer zero point
before it can say: refused.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from quantcore.errors import UnsupportedProblemError
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.transform import Transform
from quantcore.transforms.gptq_rows import GPTQRows

from .layout import HopperWeights, hopper_to_rows, rows_to_hopper

__all__ = ["TRTLLMMoEToHopper"]

#: The unsigned code of signed code 0: the symmetric zero point of 8-bit codes.
_MID = 128


class TRTLLMMoEToHopper(Transform[Mapping[str, torch.Tensor], list[HopperWeights]]):
    """Each expert of a symmetric ``trtllm_moe`` weight as a ``hopper_wgmma`` linear
    (``K`` inputs, ``N`` outputs), in expert order."""

    name = "trtllm_moe->hopper_wgmma"

    def __init__(self, fmt: TRTLLMMoE) -> None:
        self.fmt = fmt

    def apply(self, src: Mapping[str, torch.Tensor]) -> list[HopperWeights]:
        fmt = self.fmt
        experts, k, n = fmt.validate(src).values()
        if not fmt.sym:
            raise UnsupportedProblemError(
                "zeros: asymmetric trtllm_moe adds a float zero after scaling; hopper_wgmma subtracts an integer "
                "zero point before it"
            )
        q, scales = src["qweight"], src["scales"]
        groups = torch.arange(k, device=q.device) // fmt.group_size
        zeros = torch.full((scales.shape[1], n), _MID, dtype=torch.int32, device=q.device)
        return [rows_to_hopper(GPTQRows(codes=(q[e].to(torch.int32) + _MID).T.contiguous(), zeros=zeros,
                                        scales=scales[e].contiguous(), sorted_groups=groups, ret_idx=None), 8)
                for e in range(experts)]

    def invert(self, dst: list[HopperWeights]) -> dict[str, torch.Tensor]:
        rows = [hopper_to_rows(w) for w in dst]
        return {"qweight": torch.stack([(r.codes - _MID).T.to(torch.int8) for r in rows]).contiguous(),
                "scales": torch.stack([r.scales for r in rows]).contiguous()}
