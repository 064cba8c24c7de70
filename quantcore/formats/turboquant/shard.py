"""TurboQuant tensor-parallel shards (the vocabulary is :mod:`quantcore.formats.sharding`'s).

Each (row, group) slice of the weight is encoded on its own — its norm, its indices under
the group's rotation — so a shard is a set of whole slices:

column-parallel (``dim="N"``)
    rows of ``indices`` and ``norms`` (and of the residual pass's), of ``bias``; the
    rotation(s) and the codebook whole on every rank. Any part size works.
row-parallel (``dim="K"``)
    whole groups of ``d = group_size`` inputs (a rotation mixes the d inputs of its group,
    so a cut inside a group would need inputs another rank holds): columns
    ``[k0/2, k1/2)`` of ``indices`` (two per byte, within a group), ``[g0, g1)`` of
    ``norms``; with ``rotation_per_group`` the rank's rotations ``[g0, g1)``, else the one
    shared rotation on every rank. The residual pass is cut alike; the bias on rank 0 only.

Concatenation (:func:`concat_turboquant`, the inverse of a column cut): layers on the same
input laid end to end along N — rows of ``indices`` and ``norms`` per pass, ``bias`` —
when every layer holds the same rotation(s) and codebook (layers quantized with the same
draw of rotations; the quantizer draws them independently per layer otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from ..sharding import Shard, concat_of, even_split, shard_of

if TYPE_CHECKING:
    from .format import TurboQuant

__all__ = ["concat_turboquant", "shard_turboquant"]


def concat_turboquant(
    fmt: TurboQuant, parts: Sequence[Mapping[str, torch.Tensor]], *, names: Sequence[str] | None = None
) -> dict[str, torch.Tensor]:
    """``parts`` laid end to end along N (see the module docstring): rotations and the
    codebook shared."""
    rows = {prefix + name: 0 for prefix in fmt.passes for name in ("indices", "norms")}
    return concat_of(fmt, parts, {**rows, "bias": 0}, names=names)


def shard_turboquant(
    fmt: TurboQuant, tensors: Mapping[str, torch.Tensor], *, dim: str, rank: int, world: int
) -> Shard:
    dims = fmt.validate(tensors)
    k, n = dims["K"], dims["N"]
    cuts: dict[str, tuple[int, int, int] | None] = {}
    if dim == "N":
        size = even_split(fmt.slug, "N", n, world, 1, "")
        n0 = rank * size
        for prefix in fmt.passes:
            cuts[prefix + "indices"] = (0, n0, size)
            cuts[prefix + "norms"] = (0, n0, size)
        cuts["bias"] = (0, n0, size)
        return shard_of(fmt, tensors, cuts, dim="N", rank=rank, world=world, start=n0, stop=n0 + size, total=n)
    d = fmt.group_size
    size = even_split(fmt.slug, "K", k, world, d, f"whole groups of {d} inputs: a rotation mixes its group's inputs")
    k0 = rank * size
    g0, count = k0 // d, size // d
    for prefix in fmt.passes:
        cuts[prefix + "indices"] = (1, k0 // 2, size // 2)
        cuts[prefix + "norms"] = (1, g0, count)
        if fmt.rotation_per_group:
            cuts[prefix + "rotation"] = (0, g0, count)
    return shard_of(fmt, tensors, cuts, dim="K", rank=rank, world=world, start=k0, stop=k0 + size,
                    total=k, first_only=("bias",))
