"""GPTQ tensor-parallel shards (the vocabulary is :mod:`quantcore.formats.sharding`'s).

Column-parallel, ``dim="N"``: ``qweight``, ``scales`` and ``bias`` columns, ``qzeros``
lanes; ``g_idx`` whole on every rank. A part must be whole packed runs of outputs
(``qzeros`` packs along N: 8 outputs per int32 lane at 4 bits, 32 per 3 lanes at 3 bits).

Row-parallel, ``dim="K"``: ``qweight`` rows (a part must be whole packed runs of inputs),
the slice of ``g_idx``, the bias on rank 0 only. Scales and zeros follow the grouping:

plain groups (``g_idx[i] = i // group_size``; also ``desc_act`` with ``static_groups``)
    each part is whole groups: rows ``[g0, g1)`` of ``scales`` and ``qzeros``, ``g_idx``
    renumbered from 0. The shard has the layer's format.
one group (``group_size=-1``, or a group as long as K)
    every rank needs that group: ``scales`` and ``qzeros`` replicated; the shard's
    format has ``group_size=-1``.
act-order (``desc_act`` without static groups)
    a group's inputs are scattered over K, so any contiguous part of K references
    (nearly) every group. **Rule**: the cut stays contiguous in K; every rank keeps the
    whole ``scales`` and ``qzeros`` ``[G, ·]`` and its slice of ``g_idx`` with the global
    group numbers, so each rank's ``g_idx`` only names groups it holds. The shard is
    stored with ``group_size = (K/world) / G``, the size that makes G groups over K/world
    inputs a valid GPTQ tensor set; ``g_idx`` still says which input is in which group
    (groups on one rank hold uneven numbers of inputs, some none).

**Concatenation** (:func:`concat_gptq`, the inverse of a column cut): layers on the same
input laid end to end along N. ``qweight``, ``scales``, ``bias`` columns and ``qzeros``
lanes are concatenated — every layer's N is whole lanes, so lanes never straddle two
layers — and ``g_idx`` must be the same in every layer (act-order layers quantized on
the same input with the same column order are).

**The alternative, ``rule="groups"``**: rank r takes whole groups ``[r·G/w, (r+1)·G/w)``
and the inputs in them (``Shard.index``, ascending), so its shard keeps the layer's
group size, its own scales and zeros only, and ``g_idx`` renumbered from 0 — every
kernel that runs the layer runs the shard. It needs every group to hold exactly
``group_size`` inputs (GPTQ's act-order does) and the layer before to deliver those
inputs: a column-parallel layer cut with ``shard(..., dim="N", index=that_index)``
(columns taken in that order, ``qzeros`` repacked). :class:`~quantcore.checkpoint.
parallel.ParallelQuantMLP` does this with ``act_order="groups"``.

Why the default rule (vLLM's: ``marlin_repeat_scales_on_all_ranks`` is true for act-order,
and for one group on a row-parallel layer): a row-parallel layer's input is whatever
contiguous slice the layer before it produced — an attention block's heads, a
column-parallel linear's outputs — so the cut cannot follow the groups. The price is
the replicated metadata: at 4 bits and group 128, fp16 scales and 4-bit zeros are 20
bits per 512 bits of codes, so each of w ranks holds 3.9 %·w of its codes' size instead
of 3.9 %. ``rule="groups"`` instead makes the rank read a scattered set of inputs: an MLP's up
projection can produce them (its output channels may be permuted at will), an
attention output projection cannot (its input is laid out by heads).
Kernels that need equal, contiguous groups (``aten_cpu``'s int4pack op, the example
plugin's zero folding) refuse act-order row shards at ``prepare`` with
``UnsupportedProblemError`` (``bind`` moves on); the dequantizing fallback runs them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from ...errors import ShardError
from ..packing import pack_codes, unpack_codes
from ..sharding import Part, Shard, concat_of, even_split, narrow, shard_of

if TYPE_CHECKING:
    from .format import GPTQ

__all__ = ["concat_gptq", "shard_gptq"]

#: The axis each tensor's outputs run along; ``g_idx`` is shared.
_COLUMNS = {"qweight": 1, "scales": 1, "qzeros": 1, "bias": 0}


def shard_gptq(
    fmt: GPTQ,
    tensors: Mapping[str, torch.Tensor],
    *,
    dim: str,
    rank: int,
    world: int,
    rule: str | None = None,
    index: torch.Tensor | None = None,
) -> Shard:
    dims = fmt.validate(tensors)
    if rule == "groups":
        return _by_groups(fmt, tensors, dims["K"], rank, world)
    if index is not None:
        return _columns_by_index(fmt, tensors, dims["N"], index, rank, world)
    k, n = dims["K"], dims["N"]
    geo = fmt.geometry
    packed = f"{fmt.bits}-bit codes pack {geo.codes} per {geo.lanes} {geo.width}-bit lane(s)"

    def lanes(count: int) -> int:
        return count // geo.codes * geo.lanes

    if dim == "N":
        size = even_split(fmt.slug, "N", n, world, geo.codes, f"qzeros packs outputs: {packed}")
        n0 = rank * size
        columns = {"qweight": (1, n0, size), "scales": (1, n0, size), "qzeros": (1, lanes(n0), lanes(size)),
                   "bias": (0, n0, size)}
        return shard_of(fmt, tensors, columns, dim="N", rank=rank, world=world, start=n0, stop=n0 + size, total=n)

    groups = fmt.num_groups(k)
    shard_fmt = fmt
    offsets: dict[str, int] = {}
    if groups == 1:
        size = even_split(fmt.slug, "K", k, world, geo.codes, f"qweight packs inputs: {packed}")
        replicated: tuple[str, ...] = ("scales", "qzeros")
        if fmt.group_size != -1:
            shard_fmt = dataclasses.replace(fmt, group_size=-1)
    elif fmt.uses_act_order:
        boundary = (f"act-order keeps all {groups} groups on every rank, so a part holds a multiple "
                    f"of {groups} inputs; and qweight packs inputs: {packed}")
        size = even_split(fmt.slug, "K", k, world, math.lcm(geo.codes, groups), boundary)
        replicated = ("scales", "qzeros")
        shard_fmt = dataclasses.replace(fmt, group_size=size // groups)
    else:
        gs = fmt.group_size
        size = even_split(fmt.slug, "K", k, world, math.lcm(geo.codes, gs),
                          f"whole groups of {gs} inputs, and qweight packs inputs: {packed}")
        replicated = ()
        offsets["g_idx"] = rank * size // gs
    k0 = rank * size
    cuts: dict[str, tuple[int, int, int] | None] = {"qweight": (0, lanes(k0), lanes(size)), "g_idx": (0, k0, size)}
    if not replicated:
        g0, count = k0 // fmt.group_size, size // fmt.group_size
        cuts.update(scales=(0, g0, count), qzeros=(0, g0, count))
    return shard_of(fmt, tensors, cuts, shard_format=shard_fmt, dim="K", rank=rank, world=world,
                    start=k0, stop=k0 + size, total=k, offsets=offsets, first_only=("bias",))


def concat_gptq(
    fmt: GPTQ, parts: Sequence[Mapping[str, torch.Tensor]], *, names: Sequence[str] | None = None
) -> dict[str, torch.Tensor]:
    """``parts`` laid end to end along N (see the module docstring)."""
    return concat_of(fmt, parts, _COLUMNS, names=names)


def _by_groups(fmt: GPTQ, tensors: Mapping[str, torch.Tensor], k: int, rank: int, world: int) -> Shard:
    """``rule="groups"``: whole groups per rank, the inputs in them in ascending order."""
    geo = fmt.geometry
    gs, groups = fmt.effective_group_size(k), fmt.num_groups(k)
    g_idx = fmt.group_index(tensors)
    counts = torch.bincount(g_idx, minlength=groups)
    uneven = torch.nonzero(counts != gs).flatten()
    if uneven.numel():
        g = int(uneven[0])
        raise ShardError(f"{fmt.slug} shard: rule 'groups' needs every group to hold group_size={gs} inputs; "
                         f"group {g} holds {int(counts[g])}")
    unit = geo.codes // math.gcd(geo.codes, gs)  # groups per part so that the part is whole packed runs
    per = even_split(fmt.slug, "groups", groups, world, unit,
                     f"a part of K = whole groups of {gs} must be whole packed runs of {geo.codes} inputs")
    g0 = rank * per
    index = torch.nonzero((g_idx >= g0) & (g_idx < g0 + per)).flatten()
    codes = fmt.unpack_weight(tensors).index_select(0, index)
    out = {
        "qweight": pack_codes(codes, fmt.bits, dim=0, lane_dtype=fmt.pack_dtype),
        "qzeros": narrow(tensors["qzeros"], 0, g0, per),
        "scales": narrow(tensors["scales"], 0, g0, per),
    }
    parts = {"qweight": Part(axis=0), "qzeros": Part(axis=0), "scales": Part(axis=0), "bias": Part(first_only=True)}
    if "g_idx" in tensors:
        out["g_idx"] = (tensors["g_idx"].index_select(0, index) - g0).to(tensors["g_idx"].dtype)
        parts["g_idx"] = Part(axis=0, offset=g0)
    if "bias" in tensors and rank == 0:
        out["bias"] = tensors["bias"]
    size = per * gs
    return Shard(fmt, out, fmt, "K", rank, world, rank * size, (rank + 1) * size, k,
                 {n: p for n, p in parts.items() if n in tensors}, index=index)


def _columns_by_index(
    fmt: GPTQ, tensors: Mapping[str, torch.Tensor], n: int, index: torch.Tensor, rank: int, world: int
) -> Shard:
    """Outputs ``index`` in that order (to feed a row shard by groups)."""
    geo = fmt.geometry
    where = f"{fmt.slug} shard"
    if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype.is_floating_point or index.dtype == torch.bool:
        raise ShardError(f"{where}: index: expected a 1-D integer tensor of outputs, got {index!r:.60}")
    idx = index.to(device=tensors["qweight"].device, dtype=torch.int64)
    size = idx.numel()
    if size == 0 or size % geo.codes:
        raise ShardError(f"{where}: index: {size} outputs, expected a positive multiple of {geo.codes} "
                         f"(qzeros packs {geo.codes} outputs per {geo.lanes} lane(s))")
    if int(idx.min()) < 0 or int(idx.max()) >= n or torch.unique(idx).numel() != size:
        raise ShardError(f"{where}: index: expected distinct outputs in [0, {n}), got values in "
                         f"[{int(idx.min())}, {int(idx.max())}] with {size - torch.unique(idx).numel()} repeated")
    zeros = unpack_codes(tensors["qzeros"], fmt.bits, dim=1).index_select(1, idx)
    out = {
        "qweight": tensors["qweight"].index_select(1, idx),
        "scales": tensors["scales"].index_select(1, idx),
        "qzeros": pack_codes(zeros, fmt.bits, dim=1, lane_dtype=fmt.pack_dtype),
    }
    if "g_idx" in tensors:
        out["g_idx"] = tensors["g_idx"]
    if "bias" in tensors:
        out["bias"] = tensors["bias"].index_select(0, idx)
    parts = {name: Part() if name == "g_idx" else Part(axis=0 if name == "bias" else 1) for name in out}
    return Shard(fmt, out, fmt, "N", rank, world, rank * size, (rank + 1) * size, n, parts, index=index)
