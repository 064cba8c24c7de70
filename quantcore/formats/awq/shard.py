"""AWQ tensor-parallel shards (the vocabulary is :mod:`quantcore.formats.sharding`'s).

AWQ packs along the output dim: ``qweight [I, O/8]`` and ``qzeros [G, O/8]`` hold 8
outputs per int32 lane, in AWQ's nibble order *within* the lane. A column-parallel part
(``dim="N"``) is therefore whole lanes — a multiple of 8 outputs — and the lanes move
unchanged (the order is per lane, so no repacking); ``scales`` and ``bias`` columns follow.

Row-parallel (``dim="K"``): ``qweight`` rows, whole groups of ``scales`` and ``qzeros``
(AWQ has no act-order: group g is inputs ``[g·gs, (g+1)·gs)``), the bias on rank 0 only.
With one group (``group_size=-1``) every rank keeps it: ``scales`` and ``qzeros``
replicated, the shard stored with ``group_size=-1``.

Concatenation (:func:`concat_awq`, the inverse of a column cut): layers on the same input
laid end to end along N — ``qweight`` and ``qzeros`` lanes, ``scales`` and ``bias``
columns. Every layer's N is whole lanes of 8, so the lanes move unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from ..sharding import Shard, concat_of, even_split, shard_of

if TYPE_CHECKING:
    from .format import AWQ

__all__ = ["concat_awq", "shard_awq"]

_LANE = 8
#: The axis each tensor's outputs run along.
_COLUMNS = {"qweight": 1, "qzeros": 1, "scales": 1, "bias": 0}


def concat_awq(
    fmt: AWQ, parts: Sequence[Mapping[str, torch.Tensor]], *, names: Sequence[str] | None = None
) -> dict[str, torch.Tensor]:
    """``parts`` laid end to end along N (see the module docstring)."""
    return concat_of(fmt, parts, _COLUMNS, names=names)


def shard_awq(fmt: AWQ, tensors: Mapping[str, torch.Tensor], *, dim: str, rank: int, world: int) -> Shard:
    dims = fmt.validate(tensors)
    k, n = dims["K"], dims["N"]
    if dim == "N":
        size = even_split(fmt.slug, "N", n, world, _LANE, "qweight and qzeros pack 8 outputs per int32 lane")
        n0 = rank * size
        columns = {"qweight": (1, n0 // _LANE, size // _LANE), "qzeros": (1, n0 // _LANE, size // _LANE),
                   "scales": (1, n0, size), "bias": (0, n0, size)}
        return shard_of(fmt, tensors, columns, dim="N", rank=rank, world=world, start=n0, stop=n0 + size, total=n)
    groups = fmt.num_groups(k)
    shard_fmt = fmt
    if groups == 1:
        size = even_split(fmt.slug, "K", k, world, 1, "")
        cuts: dict[str, tuple[int, int, int] | None] = {"qweight": (0, rank * size, size)}
        if fmt.group_size != -1:
            shard_fmt = dataclasses.replace(fmt, group_size=-1)
    else:
        gs = fmt.group_size
        size = even_split(fmt.slug, "K", k, world, gs, f"whole groups of {gs} inputs")
        g0, count = rank * size // gs, size // gs
        cuts = {"qweight": (0, rank * size, size), "scales": (0, g0, count), "qzeros": (0, g0, count)}
    k0 = rank * size
    return shard_of(fmt, tensors, cuts, shard_format=shard_fmt, dim="K", rank=rank, world=world,
                    start=k0, stop=k0 + size, total=k, first_only=("bias",))
