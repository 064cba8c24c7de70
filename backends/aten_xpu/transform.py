"""GPTQ → the operands of ``aten._weight_int4pack_mm_with_scales_and_zeros`` (docs/aten-int4pack.md): GPTQModel's
``TorchFusedQuantLinear.transform_xpu``, step for step.

1. scales cast to the activation dtype;
2. qzeros unpacked to integer zero points ``[G, O]`` (v2 values; a v1 checkpoint's −1
   is undone first, which GPTQModel's v2-only module gets from its loader);
3. qweight unpacked, input rows reordered by ``ret_idx`` (argsort of g_idx, so every
   group is contiguous), transposed to ``[O, I]``;
4. rows packed into int32 lanes ``[O, I/8]``: lane k of row o holds inputs
   ``8k … 8k+7``, input ``8k+i`` in bits ``4i … 4i+3`` (``[in+7 … in+0]``);
5. the activation is permuted with the same ``ret_idx`` at call time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from quantcore.errors import UnsupportedProblemError
from quantcore.formats.gptq import GPTQ
from quantcore.formats.packing import pack_codes
from quantcore.transform import Transform
from quantcore.transforms.gptq_rows import GPTQToRows
from quantcore.transforms.packed import PackedLinear

__all__ = ["GPTQToInt4PackXPU", "Int4PackXPU"]


@dataclass(kw_only=True)
class Int4PackXPU(PackedLinear):
    """int32 ``[O, I/8]`` weight, int8 zero points ``[G, O]``, and the scales, which
    step 1 casts to the activation dtype (once per dtype)."""

    zeros: torch.Tensor
    scales: torch.Tensor
    META: ClassVar[str] = "scales"


class GPTQToInt4PackXPU(Transform[Mapping[str, torch.Tensor], Int4PackXPU]):
    name = "gptq->int4pack_xpu"

    def __init__(self, fmt: GPTQ) -> None:
        if fmt.bits != 4:
            raise UnsupportedProblemError(f"bits: the XPU int4pack op takes 4-bit codes, got {fmt.bits}")
        self.fmt = fmt

    def apply(self, src: Mapping[str, torch.Tensor]) -> Int4PackXPU:
        rows = GPTQToRows(self.fmt).apply(src)  # steps 2 and 3
        k, n = rows.in_features, rows.out_features
        gs = self.fmt.effective_group_size(k)
        # The op indexes groups as k // group_size: after the reorder every group must be
        # one contiguous run of exactly group_size inputs (true of GPTQ's act-order).
        if not torch.equal(rows.sorted_groups, torch.arange(k, device=rows.sorted_groups.device) // gs):
            raise UnsupportedProblemError(
                f"g_idx: the XPU op needs {k // gs} groups of exactly {gs} inputs each; this "
                "checkpoint's groups have other sizes"
            )
        return Int4PackXPU(
            weight=pack_codes(rows.codes, 4, dim=1, lane_dtype=torch.int32),  # step 4
            zeros=rows.zeros.to(torch.int8).contiguous(),
            scales=rows.scales,
            group_size=gs,
            ret_idx=rows.ret_idx,
            bias=rows.bias,
            in_features=k,
            out_features=n,
        )
