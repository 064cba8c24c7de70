"""GPTQ → the ``triton_int4`` layout, and back, losslessly.

The codes are GPTQ's as pair-interleaved blocks of 16 words per output row
(:mod:`quantcore.kernels.gptq_pairs.layout`: 128 inputs a block at 4 bits, 64 at 8;
slice ``i`` of a block sits in fields ``i`` and ``i + 16/b`` of its words), each row one
contiguous int32 run, so all weight loads are 16-byte vectors along K; the GEMV meets
the same words 16 bytes at a time (the codes of 4 words × 2 halves × the slices).

============  ====================  ===============================================
qweight       int32 [N, Kp·b/32]    the codes above, ``Kp`` = K rounded up to a block
                                    (codes past K are 0; the kernels mask x there)
scales        [G, N]                as stored (fp16/bf16/fp32)
zeros         uint8 [G, N] | None   true zero points; None when every one is 2^(b−1)
group_map     int32 [Kp/SG] | None  the group of each sub-group; None when sub-group
                                    i is group i
============  ====================  ===============================================

Inputs are sorted by group first (``transforms/gptq_rows``: act-order checkpoints get
``ret_idx`` and the kernels permute ``x`` with it). The kernels read scales per
*sub-group* of ``SG`` sorted inputs: the largest size that splits every group boundary
(their gcd), which is the group size itself for every checkpoint GPTQ and AWQ write
(act-order ones included: each group holds ``group_size`` inputs). It must be a
multiple of 32, so that no slice straddles two groups.

Bytes: ``N·Kp·b/8`` for the codes, as the checkpoint's ``qweight``; scales as stored;
zeros one byte per (group, output) instead of b bits: ``≤ 1.1×`` the checkpoint for
every group size ≥ 32 when K is a multiple of the block.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from quantcore.errors import UnsupportedProblemError
from quantcore.formats.gptq import GPTQ
from quantcore.formats.grouping import SCALE_DTYPES
from quantcore.kernels.gptq_pairs.layout import (
    SLICE,
    SUPPORTED_BITS,
    deinterleave_codes,
    interleave_codes,
    padded_k,
)
from quantcore.kernels.gptq_pairs.weights import PairedWeights
from quantcore.schema import Depends, Fields, Maybe, Satisfies, TensorSpec
from quantcore.transform import Transform
from quantcore.transforms.gptq_rows import GPTQRows, GPTQToRows

__all__ = [
    "GPTQToTritonInt",
    "TritonIntWeights",
    "sub_group_size",
    "triton_int_schema",
]


def sub_group_size(sorted_groups: torch.Tensor, k_padded: int) -> int | None:
    """The gcd of the group boundaries of ``sorted_groups`` (non-decreasing), if it is a
    multiple of the slice (32 inputs); None when no sub-group size fits. One group
    (group_size −1, or a single group) reads one row of scales: any size does."""
    k = sorted_groups.numel()
    change = (torch.nonzero(sorted_groups[1:] != sorted_groups[:-1]).flatten() + 1).tolist()
    if not change:
        return k_padded
    size = 0
    for b in [*change, k]:
        size = math.gcd(size, b)
    return size if size % SLICE == 0 else None


@dataclass(kw_only=True)
class TritonIntWeights(PairedWeights):
    """Prepared state of ``triton_int4`` (module docstring)."""

    @property
    def num_groups(self) -> int:
        return self.scales.shape[0]


def triton_int_schema(fmt: GPTQ, k: int, n: int) -> Depends:
    """The prepared schema (:mod:`quantcore.schema`) of a K × N weight of ``fmt``: the
    sub-group size prepare chose fixes the group map's length; the group map and
    ``ret_idx`` index the scales and the inputs."""
    bits = fmt.bits
    kp, groups = padded_k(k, bits), fmt.num_groups(k)
    index = TensorSpec((k,), (torch.int64,), bounds=(0, k))

    def build(p: TritonIntWeights) -> Fields:
        sg = p.sub_group if type(p.sub_group) is int and p.sub_group > 0 else SLICE
        return Fields(
            TritonIntWeights,
            qweight=TensorSpec((n, kp * bits // 32), (torch.int32,)),
            scales=TensorSpec((groups, n), SCALE_DTYPES),
            zeros=Maybe(TensorSpec((groups, n), (torch.uint8,))),
            group_map=Maybe(TensorSpec((-(-kp // sg),), (torch.int32,), bounds=(0, groups))),
            sub_group=Satisfies(lambda v: type(v) is int and 0 < v <= kp and v % SLICE == 0,
                                f"a multiple of {SLICE} up to {kp}"),
            bits=bits, in_features=k, out_features=n, ret_idx=Maybe(index),
            bias=Maybe(TensorSpec((n,), SCALE_DTYPES)), runtime={},
        )

    return Depends(TritonIntWeights, build)


class GPTQToTritonInt(Transform[Mapping[str, torch.Tensor], TritonIntWeights]):
    name = "gptq->triton_int"

    def __init__(self, fmt: GPTQ) -> None:
        self.fmt = fmt

    def apply(self, src: Mapping[str, torch.Tensor]) -> TritonIntWeights:
        fmt = self.fmt
        if fmt.bits not in SUPPORTED_BITS:
            raise UnsupportedProblemError(f"bits: triton_int4 takes {SUPPORTED_BITS}-bit codes, got {fmt.bits}")
        rows = GPTQToRows(fmt).apply(src)
        kp = padded_k(rows.in_features, fmt.bits)
        sg = sub_group_size(rows.sorted_groups, kp)
        if sg is None:
            raise UnsupportedProblemError(
                f"g_idx: triton_int4 reads scales per run of {SLICE} sorted inputs, and this "
                f"checkpoint's group boundaries are not all multiples of {SLICE}"
            )
        starts = torch.arange(0, kp, sg, device=rows.sorted_groups.device).clamp_max(rows.in_features - 1)
        group_map = rows.sorted_groups[starts].to(torch.int32)
        real = torch.arange(0, rows.in_features, sg, device=group_map.device).numel()
        identity = torch.equal(group_map[:real].long(), torch.arange(real, device=group_map.device))
        mid = 1 << (fmt.bits - 1)
        zeros = None if bool((rows.zeros == mid).all()) else rows.zeros.to(torch.uint8).contiguous()
        return TritonIntWeights(
            qweight=interleave_codes(rows.codes, fmt.bits),
            scales=rows.scales.contiguous(),
            zeros=zeros,
            group_map=None if identity else group_map.contiguous(),
            sub_group=sg,
            bits=fmt.bits,
            in_features=rows.in_features,
            out_features=rows.out_features,
            ret_idx=rows.ret_idx,
            bias=None if rows.bias is None else rows.bias.contiguous(),  # the kernel reads it with unit stride
        )

    def invert(self, dst: TritonIntWeights) -> dict[str, torch.Tensor]:
        k, n = dst.in_features, dst.out_features
        device = dst.qweight.device
        groups = dst.num_groups
        if dst.group_map is None:
            sorted_groups = (torch.arange(k, device=device) // dst.sub_group).clamp_max(groups - 1)
        else:
            sorted_groups = dst.group_map.long()[torch.arange(k, device=device) // dst.sub_group]
        zeros = dst.zeros
        zeros = (torch.full((groups, n), 1 << (dst.bits - 1), dtype=torch.int32, device=device)
                 if zeros is None else zeros.to(torch.int32))
        rows = GPTQRows(
            codes=deinterleave_codes(dst.qweight, dst.bits, k),
            zeros=zeros,
            scales=dst.scales,
            sorted_groups=sorted_groups,
            ret_idx=dst.ret_idx,
            bias=dst.bias,
        )
        return GPTQToRows(self.fmt).invert(rows)
