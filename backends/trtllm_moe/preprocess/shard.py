"""Tensor-parallel shards of the preprocessed layout itself, without undoing it.

What the steps of :mod:`.preprocessor` leave, per expert (``[E, K, N·bits/8]`` bytes):

SM 75–89 and MoE on SM 90 (LDSM, column tiles of R rows, I columns interleaved)
    ``[N/I, K/R, I, R·bits/8]``: column group, K tile, column within the group, the tile's
    bytes (rows permuted in blocks of ``rows_per_mma`` ≤ R, then the +128 / +8 bias and
    the register interleave inside 4-byte words of those bytes).
SM 70–74, SM 90 (no interleave)
    ``[N, K·bits/8]``: the plain transpose (on SM 70–74 biased and register-interleaved
    inside 4-byte words along K).

Every step acts inside one column group and one K tile, so a part that is whole column
groups (N) or whole K tiles (K) is a slice of these bytes, and it is exactly what the
preprocessor makes of the logical shard — provided the shard itself meets the
preprocessor's shape rules (N % 8 with LDSM, 32-byte vectors for the transpose). The
tests check ``shard(preprocess(W)) == preprocess(shard(W))`` byte for byte on every
arch and weight type. A part that breaks a tile or a rule is refused naming it, with the
world sizes that work.
"""

from __future__ import annotations

import math

import torch

from quantcore.errors import ShardError
from quantcore.formats.sharding import check_request, even_split, narrow

from .layout import LayoutDetails
from .preprocessor import CutlassMixedGemmLayout, check_shape

__all__ = ["layout_unit", "shard_preprocessed"]


def layout_unit(details: LayoutDetails, dim: str) -> tuple[int, str]:
    """The smallest part along ``dim`` (``"K"`` or ``"N"``, in elements) that is whole
    tiles of the layout and meets the preprocessor's shape rules, and why."""
    qt, bits = details.quant_type, details.quant_type.bits
    vector = 32 * 8 // bits  # the transpose moves 32-byte vectors
    if dim == "N":
        unit, why = vector, [f"{vector}-element vectors of the transpose"]
        if details.uses_imma_ldsm:
            unit, why = math.lcm(unit, 8), [*why, "N % 8 for the MMA"]
        if details.columns_interleaved > 1:
            i = details.columns_interleaved
            unit, why = math.lcm(unit, i), [*why, f"groups of {i} interleaved columns"]
        return unit, ", ".join(why)
    unit, why = vector, [f"{vector}-element vectors of the transpose"]
    if details.uses_imma_ldsm:
        unit, why = math.lcm(unit, qt.rows_per_mma), [*why, f"row-permutation blocks of {qt.rows_per_mma}"]
    if details.columns_interleaved > 1:
        r = details.rows_per_column_tile
        unit, why = math.lcm(unit, r), [*why, f"column tiles of {r} rows"]
    return unit, ", ".join(why)


def shard_preprocessed(
    layout: CutlassMixedGemmLayout,
    processed: torch.Tensor,
    *,
    dim: str,
    rank: int,
    world: int,
    group_size: int = 1,
) -> torch.Tensor:
    """Rank ``rank``'s part of preprocessed ``[E, K, N·bits/8]`` (or ``[K, N·bits/8]``)
    bytes cut along ``dim`` ("K" or "N") into ``world`` parts: the preprocessed bytes of
    the logical shard. ``group_size`` adds the scales' group boundary to a K cut."""
    details = layout.details
    qt = details.quant_type
    where = f"{qt.value} layout for SM {details.arch}"
    experts = processed.unsqueeze(0) if processed.dim() == 2 else processed
    if processed.dtype != torch.int8 or experts.dim() != 3:
        raise ShardError(f"{where} shard: processed: expected int8 [E, K, N·bits/8], got "
                           f"{tuple(processed.shape)} {processed.dtype}")
    e, k, nb = experts.shape
    n = nb * qt.elements_per_byte
    check_request(where, dim, rank, world, ("K", "N"))
    check_shape(k, n, details)
    unit, why = layout_unit(details, dim)
    if dim == "K" and group_size > 1:
        unit, why = math.lcm(unit, group_size), f"{why}, whole groups of {group_size} rows"
    size = even_split(where, dim, k if dim == "K" else n, world, unit, why)
    start = rank * size
    tile_bytes = details.rows_per_column_tile * qt.bits // 8
    i = details.columns_interleaved
    if i > 1:  # [E, N/I, K/R, I·R·bits/8]
        view = experts.reshape(e, n // i, k // details.rows_per_column_tile, i * tile_bytes)
        if dim == "N":
            part = narrow(view, 1, start // i, size // i)
        else:
            r = details.rows_per_column_tile
            part = narrow(view, 2, start // r, size // r)
    else:  # [E, N, K·bits/8]
        view = experts.reshape(e, n, k * qt.bits // 8)
        part = narrow(view, 1, start, size) if dim == "N" else narrow(view, 2, start * qt.bits // 8, size * qt.bits // 8)
    shape = (e, size, nb) if dim == "K" else (e, k, size * qt.bits // 8)
    out = part.reshape(shape)
    return out if processed.dim() == 3 else out[0]
