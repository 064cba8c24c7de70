"""GPTQ → the layout of ``aten._weight_int4pack_mm_for_cpu`` (docs/aten-int4pack.md),
shared by the kernels on that op (:mod:`quantcore.kernels.int4pack_cpu`).

Beyond GPTQModel's ``transform_cpu``: asymmetric checkpoints keep their zero points. The op computes
``w = (q − 8) · s + offset`` per (group, output) (docs/aten-int4pack.md, measured), so
an integer zero point z becomes the float offset ``(8 − z) · s``; symmetric
checkpoints (z = 8) get 0, as GPTQModel's zeroed tensor does.

Group sizes the op lacks (−1, 512, uneven act-order groups) run by repeating each
group's scale and offset over the largest sub-group size the op takes that divides
every group boundary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import UnsupportedProblemError
from ..formats.gptq import GPTQ
from ..transform import Transform
from ..transforms.gptq_rows import GPTQToRows, scales_and_offsets
from ..transforms.packed import PackedLinear

__all__ = ["OP_GROUP_SIZES", "GPTQToInt4PackCPU", "Int4PackCPU"]

#: qGroupSize values ``_weight_int4pack_mm_for_cpu`` accepts (measured, torch 2.13).
OP_GROUP_SIZES = (32, 64, 128, 256)
#: ``_convert_weight_to_int4pack_for_cpu`` requires N % 16 == 0.
N_ALIGN = 16
#: The op subtracts this from every code before scaling.
CODE_BIAS = 8


@dataclass(kw_only=True)
class Int4PackCPU(PackedLinear):
    """Prepared state: the op's (ISA-specific) uint8 ``[N, K/2]`` weight and float32
    ``[K/group, N, 2]`` (scale, offset) pairs, cast per activation dtype."""

    scales_offsets: torch.Tensor
    META: ClassVar[str] = "scales_offsets"


class GPTQToInt4PackCPU(Transform[Mapping[str, torch.Tensor], Int4PackCPU]):
    name = "gptq->int4pack_cpu"

    def __init__(self, fmt: GPTQ) -> None:
        if fmt.bits != 4:
            raise UnsupportedProblemError(f"bits: the CPU int4pack op takes 4-bit codes, got {fmt.bits}")
        self.fmt = fmt

    def apply(self, src: Mapping[str, torch.Tensor]) -> Int4PackCPU:
        rows = GPTQToRows(self.fmt).apply(src)
        n, k = rows.out_features, rows.in_features
        if n % N_ALIGN:
            raise UnsupportedProblemError(
                f"out_features: the CPU int4pack op needs a multiple of {N_ALIGN}, got {n}"
            )
        grouped = scales_and_offsets(rows, OP_GROUP_SIZES, CODE_BIAS)
        if grouped is None:
            raise UnsupportedProblemError(
                f"g_idx: no group size the op takes ({OP_GROUP_SIZES}) splits the groups of "
                f"this checkpoint (group_size={self.fmt.group_size}, in_features={k})"
            )
        group, scales_offsets = grouped
        weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(rows.codes.cpu(), 2)
        return Int4PackCPU(
            weight=weight,
            scales_offsets=scales_offsets,
            group_size=group,
            ret_idx=rows.ret_idx,
            bias=rows.bias,
            in_features=k,
            out_features=n,
        )
