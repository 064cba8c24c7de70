"""GPTQ → the ``hopper_wgmma`` layout, and back, losslessly.

**Blocks and pairs** (:mod:`quantcore.kernels.gptq_pairs.layout`, the words
``triton_int4`` reads too): the sorted inputs of each output row are cut into blocks of
16 int32 words (128 inputs at 4 bits, 64 at 8); a block is ``PAIRS = 16 / b`` slices of
32 inputs, and word ``c`` holds inputs ``2c`` and ``2c + 1`` of slice ``i`` in fields
``i`` and ``i + PAIRS``, 16 bits apart. Viewed as int16, element ``e`` of a block row
holds input ``e`` of every slice, so one LOP3 of a word gives the pair of halves
``B + q`` that a tensor-core operand register holds (``kernels.py``).

**Fragments.** wgmma's A operand from registers gives thread ``t = 32w + 4g + u`` of a
warpgroup (warp ``w``, lane ``4g + u``) rows ``16w + g`` and ``16w + 8 + g`` of a 64-row
tile, and in each row the pairs ``c = u + 4j``, ``j = 0…3`` — four words 16 bytes apart
in the row. The words of each (64-row tile, block) are stored so that each thread's
four words of one row are contiguous, threads in order, row half ``h`` outermost:

    word  1024·(tile·blocks + block) + 512·h + 4·t + j
      =   word ``u + 4j`` of block ``block`` of row ``64·tile + 16w + 8h + g``

so a thread reads its whole fragment of a block with two 16-byte loads, and a warp's
loads are 512 contiguous bytes (no bank conflicts once TMA has put the block in shared
memory). Rows past N (to a multiple of 64) hold zero codes.

============  ===========================  ==========================================
qweight       int32 [N/64, blocks·1024]    the words above
scales        [subs, Np] as stored         one row per **sub-group** of ``SG`` sorted
                                           inputs (its group's scales), columns padded
                                           with zeros to ``Np`` = N rounded up to 64
zeros         uint8 [subs, Np] | None      true zero points per sub-group; None when
                                           every one is 2^(b−1)
group_map     int32 [subs] | None          the group of each sub-group (for the
                                           inverse); None when sub-group i is group i
============  ===========================  ==========================================

Inputs are sorted by group first (``transforms/gptq_rows``; act-order checkpoints keep
``ret_idx`` and the call permutes x). ``SG`` is the gcd of the group boundaries (the
group size for every checkpoint GPTQ and AWQ write, act-order ones included); the kernel
fetches whole rows of scales per block with TMA, so ``SG`` must divide the block or be a
multiple of it. Bytes: the codes as the checkpoint's ``qweight`` (plus K padded to a
block and N to 64 rows), scales as stored, zero points one byte per (sub-group, output).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from quantcore.errors import UnsupportedProblemError
from quantcore.formats.gptq import GPTQ
from quantcore.kernels.gptq_pairs.layout import (
    BLOCK_WORDS,
    SLICE,
    SUPPORTED_BITS,
    block_k,
    deinterleave_codes,
    interleave_codes,
    padded_k,
)
from quantcore.kernels.gptq_pairs.weights import PairedWeights
from quantcore.transform import Transform
from quantcore.transforms.gptq_rows import GPTQRows, GPTQToRows

__all__ = [
    "TILE_N",
    "GPTQToHopper",
    "HopperWeights",
    "LookupWeights",
    "bias_operand",
    "bound_to",
    "fragment_order",
    "hopper_to_rows",
    "row_order",
    "rows_to_hopper",
    "sub_group_size",
    "weight_source",
]

#: Output rows of one warpgroup's tile (wgmma's M).
TILE_N = 64


def fragment_order(words: torch.Tensor) -> torch.Tensor:
    """Row-major block words ``[N, blocks·16]`` (N a multiple of 64) → the fragment order
    ``[N/64, blocks·1024]`` (module docstring)."""
    n, nw = words.shape
    blocks = nw // BLOCK_WORDS
    # row = 64·tile + 16w + 8h + g; word c = u + 4j
    w = words.view(n // TILE_N, 4, 2, 8, blocks, 4, 4)  # tile, w, h, g, block, j, u
    w = w.permute(0, 4, 2, 1, 3, 6, 5)  # tile, block, h, w, g, u, j
    return w.reshape(n // TILE_N, blocks * 1024).contiguous()


def row_order(frag: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`fragment_order`: ``[N/64, blocks·1024]`` → ``[N, blocks·16]``."""
    tiles, nw = frag.shape
    blocks = nw // 1024
    w = frag.view(tiles, blocks, 2, 4, 8, 4, 4)  # tile, block, h, w, g, u, j
    w = w.permute(0, 3, 2, 4, 1, 6, 5)  # tile, w, h, g, block, j, u
    return w.reshape(tiles * TILE_N, blocks * BLOCK_WORDS).contiguous()


def sub_group_size(sorted_groups: torch.Tensor, k_padded: int) -> int:
    """The gcd of the group boundaries of ``sorted_groups`` (non-decreasing): the largest
    run of sorted inputs that never straddles two groups; ``k_padded`` for one group.
    The end of the last group is no boundary (past it x is zero)."""
    change = (torch.nonzero(sorted_groups[1:] != sorted_groups[:-1]).flatten() + 1).tolist()
    if not change:
        return k_padded
    size = 0
    for b in change:
        size = math.gcd(size, b)
    return size


@dataclass(kw_only=True)
class HopperWeights(PairedWeights):
    """Prepared state of ``hopper_wgmma`` (module docstring); scales are per sub-group, so
    it keeps the groups' count."""

    num_groups: int

    @property
    def tiles(self) -> int:
        return self.qweight.shape[0]


@dataclass(kw_only=True)
class LookupWeights(HopperWeights):
    """4-bit codes in this layout that index a codebook instead of counting from a zero
    point: ``ŵ = codebook[q]·scale`` (the kernels' ``LOOKUP`` operand, ``codebook.py``).
    ``codebook`` is float32 ``[16]``, the scales float32; no zero points and no bias (the
    kernels read the codebook where they would read the bias)."""

    codebook: torch.Tensor


def bias_operand(w: HopperWeights) -> torch.Tensor:
    """What a launch reads in the bias position: a codebook weight's codebook, else the
    bias, else the scales (a tensor that is never read, for the pointer)."""
    if isinstance(w, LookupWeights):
        return w.codebook
    return w.bias if w.bias is not None else w.scales


#: The tensors a launch bound: the packed words by weak reference (they own the launch
#: state the binding is kept in), the scales, the zero points and the bias operand.
WeightSource = tuple[Any, torch.Tensor, torch.Tensor | None, torch.Tensor]


def weight_source(w: HopperWeights) -> WeightSource:
    """What a binding of ``w`` holds on to (:func:`bound_to` checks it)."""
    return weakref.ref(w.qweight), w.scales, w.zeros, bias_operand(w)


def bound_to(source: WeightSource, w: HopperWeights) -> bool:
    """Whether ``w``'s tensors are the ones bound (a state whose fields were replaced is
    bound again)."""
    return source[0]() is w.qweight and source[1] is w.scales and source[2] is w.zeros \
        and source[3] is bias_operand(w)


def _pad_cols(t: torch.Tensor, cols: int) -> torch.Tensor:
    out = torch.zeros(t.shape[0], cols, dtype=t.dtype, device=t.device)
    out[:, : t.shape[1]] = t
    return out


class GPTQToHopper(Transform[Mapping[str, torch.Tensor], HopperWeights]):
    name = "gptq->hopper_wgmma"

    def __init__(self, fmt: GPTQ) -> None:
        self.fmt = fmt

    def apply(self, src: Mapping[str, torch.Tensor]) -> HopperWeights:
        if self.fmt.bits not in SUPPORTED_BITS:
            raise UnsupportedProblemError(f"bits: hopper_wgmma takes {SUPPORTED_BITS}-bit codes, got {self.fmt.bits}")
        return rows_to_hopper(GPTQToRows(self.fmt).apply(src), self.fmt.bits)

    def invert(self, dst: HopperWeights) -> dict[str, torch.Tensor]:
        return GPTQToRows(self.fmt).invert(hopper_to_rows(dst))


def rows_to_hopper(rows: GPTQRows, bits: int) -> HopperWeights:
    """The prepared layout of a linear's codes, zero points and scales (``GPTQRows``)."""
    k, n = rows.in_features, rows.out_features
    kp, bk = padded_k(k, bits), block_k(bits)
    sg = sub_group_size(rows.sorted_groups, kp)
    if not (sg % bk == 0 or (bk % sg == 0 and sg % SLICE == 0)):
        raise UnsupportedProblemError(
            f"g_idx: hopper_wgmma reads scales per run of sorted inputs that divides its {bk}-input "
            f"block or is a multiple of it; this checkpoint's group boundaries have gcd {sg}"
        )
    device = rows.sorted_groups.device
    starts = torch.arange(0, kp, sg, device=device).clamp_max(k - 1)
    group_map = rows.sorted_groups[starts].long()
    groups = rows.scales.shape[0]
    if torch.unique(group_map).numel() != groups:
        raise UnsupportedProblemError(
            f"g_idx: {groups} groups but only {torch.unique(group_map).numel()} hold inputs; "
            "hopper_wgmma keeps scales per sub-group and would lose the empty groups' scales"
        )
    identity = group_map.numel() == groups and torch.equal(group_map, torch.arange(groups, device=device))
    np_ = -(-n // TILE_N) * TILE_N
    mid = 1 << (bits - 1)
    zeros = None
    if not bool((rows.zeros == mid).all()):
        zeros = _pad_cols(rows.zeros.to(torch.uint8)[group_map], np_).contiguous()
    words = torch.zeros(np_, kp * bits // 32, dtype=torch.int32, device=device)
    words[:n] = interleave_codes(rows.codes, bits)
    return HopperWeights(
        qweight=fragment_order(words),
        scales=_pad_cols(rows.scales[group_map], np_).contiguous(),
        zeros=zeros,
        group_map=None if identity else group_map.to(torch.int32).contiguous(),
        num_groups=groups,
        sub_group=sg,
        bits=bits,
        in_features=k,
        out_features=n,
        ret_idx=rows.ret_idx,
        bias=None if rows.bias is None else rows.bias.contiguous(),
    )


def hopper_to_rows(dst: HopperWeights) -> GPTQRows:
    """The codes, zero points and scales that :func:`rows_to_hopper` laid out."""
    k, n = dst.in_features, dst.out_features
    device = dst.qweight.device
    subs = dst.scales.shape[0]
    group_map = (torch.arange(subs, device=device) if dst.group_map is None else dst.group_map.long())
    # The first sub-group of each group holds its row (rows_to_hopper checked that every group has one).
    first = torch.full((dst.num_groups,), subs, dtype=torch.long, device=device)
    first.scatter_reduce_(0, group_map, torch.arange(subs, device=device), reduce="amin")
    sorted_groups = group_map[(torch.arange(k, device=device) // dst.sub_group).clamp_max(subs - 1)]
    zeros = (torch.full((dst.num_groups, n), 1 << (dst.bits - 1), dtype=torch.int32, device=device)
             if dst.zeros is None else dst.zeros[first, :n].to(torch.int32))
    return GPTQRows(
        codes=deinterleave_codes(row_order(dst.qweight)[:n], dst.bits, k),
        zeros=zeros,
        scales=dst.scales[first, :n].contiguous(),
        sorted_groups=sorted_groups,
        ret_idx=dst.ret_idx,
        bias=dst.bias,
    )
