"""GPTQ checkpoint → codes in rows ``[O, I]`` with inputs sorted by group.

The common first step of the GPTQ kernels' transforms (torch's int4pack layouts on CPU,
XPU and CUDA, Triton's): unpack ``qweight``, reorder the input rows by ``ret_idx =
argsort(g_idx)`` so every group is contiguous, transpose to one row per output. Kernels
then permute activations with the same ``ret_idx``. Nothing is lost, so the inverse
rebuilds the checkpoint tensors bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..formats.gptq import GPTQ
from ..formats.gptq.convert import zero_to_stored
from ..formats.packing import pack_codes
from ..transform import Transform

__all__ = ["GPTQRows", "GPTQToRows", "largest_dividing_group", "scales_and_offsets"]


@dataclass(frozen=True)
class GPTQRows:
    codes: torch.Tensor  # [O, I] int32, inputs in ret_idx order
    zeros: torch.Tensor  # [G, O] int32, true zero points (v1 offset undone)
    scales: torch.Tensor  # [G, O] as stored
    sorted_groups: torch.Tensor  # [I] int64, g_idx[ret_idx]: non-decreasing
    ret_idx: torch.Tensor | None  # [I] int64; None when g_idx is already sorted
    bias: torch.Tensor | None = None

    @property
    def in_features(self) -> int:
        return self.codes.shape[1]

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]


class GPTQToRows(Transform[Mapping[str, torch.Tensor], GPTQRows]):
    name = "gptq->rows"

    def __init__(self, fmt: GPTQ) -> None:
        self.fmt = fmt

    def apply(self, src: Mapping[str, torch.Tensor]) -> GPTQRows:
        fmt = self.fmt
        fmt.validate(src)
        g_idx = fmt.group_index(src)
        order = torch.argsort(g_idx, stable=True)
        identity = torch.equal(order, torch.arange(g_idx.numel(), device=g_idx.device))
        ret_idx = None if identity else order
        codes = fmt.unpack_weight(src)  # [I, O]
        if ret_idx is not None:
            codes = codes.index_select(0, ret_idx)
        sorted_groups = g_idx if ret_idx is None else g_idx[ret_idx]
        return GPTQRows(
            codes=codes.T.contiguous(),
            zeros=fmt.unpack_zeros(src),
            scales=src["scales"],
            sorted_groups=sorted_groups,
            ret_idx=ret_idx,
            bias=src.get("bias"),
        )

    def invert(self, dst: GPTQRows) -> dict[str, torch.Tensor]:
        fmt = self.fmt
        codes = dst.codes.T  # [I, O] in sorted order
        g_idx = dst.sorted_groups
        if dst.ret_idx is not None:
            unsorted = torch.empty_like(codes)
            unsorted[dst.ret_idx] = codes
            codes = unsorted
            g_idx = torch.empty_like(dst.sorted_groups)
            g_idx[dst.ret_idx] = dst.sorted_groups
        stored = zero_to_stored(dst.zeros, fmt)
        out = {
            "qweight": pack_codes(codes, fmt.bits, dim=0, lane_dtype=fmt.pack_dtype),
            "qzeros": pack_codes(stored, fmt.bits, dim=1, lane_dtype=fmt.pack_dtype),
            "scales": dst.scales,
            "g_idx": g_idx.to(torch.int32),
        }
        if dst.bias is not None:
            out["bias"] = dst.bias
        return out


def largest_dividing_group(sorted_groups: torch.Tensor, accepted: tuple[int, ...]) -> int | None:
    """The largest size in ``accepted`` that splits every group of ``sorted_groups``
    into whole sub-groups, or None. Sub-groups of that size can each take their group's
    scale, which is how a kernel with a fixed menu of group sizes runs any GPTQ grouping
    (-1, partial last groups, uneven act-order groups)."""
    n = sorted_groups.numel()
    change = torch.nonzero(sorted_groups[1:] != sorted_groups[:-1]).flatten() + 1
    bounds = [*change.tolist(), n]
    for size in sorted(accepted, reverse=True):
        if all(b % size == 0 for b in bounds):
            return size
    return None


def scales_and_offsets(
    rows: GPTQRows, accepted: tuple[int, ...], code_bias: int
) -> tuple[int, torch.Tensor] | None:
    """Per-sub-group ``(scale, offset)`` for ops that compute ``(q − code_bias)·s + offset``
    (torch's int4pack ops, ``code_bias`` = 8): ``(sub-group size, [I/size, O, 2] float32)``,
    or None when no accepted size splits the groups. An integer zero point z becomes the
    offset ``(code_bias − z)·s``, since ``(q − z)·s = (q − code_bias)·s + (code_bias − z)·s``."""
    group = largest_dividing_group(rows.sorted_groups, accepted)
    if group is None:
        return None
    sub = rows.sorted_groups[::group]  # the group of each op-sized sub-group
    scales = rows.scales.float()[sub]
    offsets = (code_bias - rows.zeros[sub].float()) * scales
    return group, torch.stack([scales, offsets], dim=-1).contiguous()
