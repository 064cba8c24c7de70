"""Tensor-parallel shards of a format's stored tensors: what every format's ``shard`` shares.

An engine that spreads a layer over ``world`` ranks cuts it along one dim:

``"N"``  column-parallel: rank r computes outputs ``[r·N/w, (r+1)·N/w)``; the ranks'
         outputs are concatenated.
``"K"``  row-parallel: rank r reads inputs ``[r·K/w, (r+1)·K/w)`` and computes a partial
         product; the ranks' outputs are summed (an all-reduce). The bias is added once:
         only rank 0's shard holds it, as in vLLM's ``RowParallelLinear``.
``"E"``  expert-parallel (MoE formats): rank r holds experts ``[r·E/w, (r+1)·E/w)``.

A shard is a valid set of stored tensors of the format for the smaller layer, so every
kernel that takes the format takes the shard. Cuts must fall on the format's boundaries
(a packed lane, a quantization group, a layout tile); a cut that does not is refused
naming the boundary and listing the world sizes that would work. Every check reads only
what every rank has — the format, the layer's shape, ``world`` — so all ranks reach the
same verdict before any collective, and none is left waiting on a peer that failed.

Each shard records how each of its tensors relates to the whole (a :class:`Part`), so a
complete set of shards can be checked for consistency (:func:`check_shards`: one format,
one group size, one world, ranks ``0 … w−1`` once each) and put back together bit for
bit (:func:`unshard`).

The inverse direction, for layers rather than ranks: :func:`concat_of` lays several
layers that read the same input end to end along N (q/k/v, gate/up) as one layer's
stored tensors, bit for bit, when they share everything but their outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..errors import FusionError, ShardError, TensorFormatError

if TYPE_CHECKING:
    from .base import Format

__all__ = [
    "DIMS",
    "Part",
    "Shard",
    "check_request",
    "check_shards",
    "concat_of",
    "even_split",
    "format_difference",
    "merged_index",
    "narrow",
    "unshard",
    "working_worlds",
]

#: The dims a layer can be cut along (see the module docstring).
DIMS = ("K", "N", "E")
#: At most this many world sizes are listed in a refusal.
_LISTED = 10


@dataclass(frozen=True)
class Part:
    """How one stored tensor of a shard relates to the whole layer's."""

    #: The tensor axis that is cut; ``None``: every rank holds the whole tensor.
    axis: int | None = None
    #: Subtracted from this shard's values (a plain ``g_idx`` renumbered from 0).
    offset: int = 0
    #: Held by rank 0 alone (a row-parallel bias, added once after the sum).
    first_only: bool = False


@dataclass(frozen=True)
class Shard:
    """Rank ``rank``'s part of a layer cut along ``dim`` into ``world`` equal parts."""

    #: The shard's format: the layer's, except where a rule says otherwise (an
    #: act-order GPTQ row shard keeps every group, see ``formats/gptq/shard.py``).
    format: Format
    tensors: dict[str, torch.Tensor]
    #: The whole layer's format.
    parent: Format
    dim: str
    rank: int
    world: int
    #: This shard covers ``[start, stop)`` of the layer's ``dim`` (of ``total``).
    start: int
    stop: int
    total: int
    parts: dict[str, Part] = field(default_factory=dict)
    #: The layer's positions along ``dim`` this shard holds, in its order, when they are
    #: not the range ``[start, stop)`` (an act-order GPTQ row shard by whole groups reads
    #: scattered inputs; the column shard feeding it produces them). ``[start, stop)`` is
    #: then the shard's place in the concatenation of the ranks' indices.
    index: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.stop - self.start

    def describe(self) -> str:
        return f"{self.parent.slug} {self.dim}[{self.start}:{self.stop}] of {self.total}, rank {self.rank}/{self.world}"


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_request(owner: str, dim: object, rank: object, world: object, dims: Sequence[str]) -> None:
    """``dim`` one of ``dims`` (the cuts this layer has), ``world >= 1``, ``0 <= rank < world``;
    ``owner`` names the layer (a format's slug, a layout)."""
    where = f"{owner} shard"
    if not isinstance(dim, str) or dim not in dims:
        raise ShardError(f"{where}: dim: expected one of {', '.join(map(repr, dims))}, got {dim!r}")
    if not _is_int(world) or world < 1:  # type: ignore[operator]
        raise ShardError(f"{where}: world: expected an int >= 1, got {world!r}")
    if not _is_int(rank) or not 0 <= rank < world:  # type: ignore[operator]
        raise ShardError(f"{where}: rank: expected an int in [0, {world}) for world={world}, got {rank!r}")


def working_worlds(total: int, unit: int) -> list[int]:
    """World sizes that cut ``total`` into equal parts, each a multiple of ``unit``."""
    return [w for w in range(1, total + 1) if total % w == 0 and (total // w) % unit == 0]


def even_split(where: str, dim: str, total: int, world: int, unit: int, boundary: str) -> int:
    """The size of each rank's part of ``total``, or a :class:`ShardError` naming the
    ``boundary`` a part must end on (``unit`` elements) and listing the worlds that work.
    ``where`` names the layer (a format's slug, a layout)."""
    if world == 1 or (total % world == 0 and (total // world) % unit == 0):
        return total // world
    ok = working_worlds(total, unit)
    listed = ", ".join(str(w) for w in ok[:_LISTED]) + (", …" if len(ok) > _LISTED else "")
    sizes = ", ".join(str(total // w) for w in ok[:_LISTED])
    why = (f"{world} does not divide {total}" if total % world else
           f"a part of {total // world} is not a multiple of {unit} ({boundary})")
    raise ShardError(
        f"{where} shard: {dim} = {total} over world={world}: {why}; splits that work: "
        f"world ∈ {{{listed}}} (parts of {sizes})"
    )


def merged_index(sizes: Sequence[int], rank: int, world: int) -> torch.Tensor:
    """The outputs rank ``rank`` holds of a layer whose N is several parts laid end to end
    (a fused gate/up projection, TensorRT-LLM's gated W1 ``[…, 2·I]``): each part cut into
    ``world`` and the rank's pieces concatenated, so pairs that meet in an activation stay
    on one rank (vLLM's ``MergedColumnParallelLinear``). Pass it as ``shard(..., index=)``."""
    pieces, base = [], 0
    for size in sizes:
        part = even_split("merged layer", "N", size, world, 1, "")
        pieces.append(torch.arange(base + rank * part, base + (rank + 1) * part))
        base += size
    return torch.cat(pieces)


def narrow(t: torch.Tensor, axis: int, start: int, length: int) -> torch.Tensor:
    """An owned copy of a slice: a view would keep the whole checkpoint tensor alive."""
    return t.narrow(axis, start, length).clone(memory_format=torch.contiguous_format)


# --- a complete set of shards ----------------------------------------------------------------


def format_difference(a: Format, b: Format) -> str:
    """What differs between two formats, for messages: ``format gptq vs awq`` or
    ``group_size 128 vs 64, sym True vs False``."""
    if type(a) is not type(b):
        return f"format {a.name} vs {b.name}"
    pa, pb = a.params(), b.params()
    diff = [f"{k} {pa[k]!r} vs {pb[k]!r}" for k in pa if pa[k] != pb.get(k)]
    return ", ".join(diff) or f"{a.slug} vs {b.slug}"


def check_shards(shards: Sequence[Shard]) -> None:
    """A complete, consistent set of one layer's shards, or a :class:`ShardError` naming
    the first disagreement: one parent format and one shard format (bits, group size …),
    one dim and world, ranks ``0 … w−1`` once each covering ``[0, total)`` in order, the
    same tensors, and replicated tensors equal on every rank. Reads only the shards, so
    every rank that holds the same list (a pre-sharded checkpoint's headers) agrees."""
    if not shards or not all(isinstance(s, Shard) for s in shards):
        raise ShardError(f"shards: expected a non-empty sequence of Shard, got {shards!r:.80}")
    first = shards[0]
    where = f"{first.parent.slug} shards"
    for s in shards:
        if s.parent != first.parent:
            raise ShardError(f"{where}: shard of rank {s.rank} belongs to another layer format "
                             f"({format_difference(s.parent, first.parent)})")
        if s.format != first.format:
            raise ShardError(f"{where}: shard of rank {s.rank} has format {s.format.slug}, rank "
                             f"{first.rank} has {first.format.slug} ({format_difference(s.format, first.format)})")
        if (s.dim, s.world, s.total) != (first.dim, first.world, first.total):
            raise ShardError(f"{where}: shard of rank {s.rank} cuts {s.dim} = {s.total} over world={s.world}, "
                             f"rank {first.rank} cuts {first.dim} = {first.total} over world={first.world}")
    ranks = sorted(s.rank for s in shards)
    if ranks != list(range(first.world)):
        raise ShardError(f"{where}: expected ranks 0 … {first.world - 1} once each, got {ranks}")
    ordered = sorted(shards, key=lambda s: s.rank)
    edge = 0
    for s in ordered:
        if s.start != edge or s.stop <= s.start:
            raise ShardError(f"{where}: rank {s.rank} covers {s.dim}[{s.start}:{s.stop}], expected to start at {edge}")
        edge = s.stop
    if edge != first.total:
        raise ShardError(f"{where}: the shards cover {first.dim}[0:{edge}] of {first.total}")
    if any(s.index is not None for s in ordered):
        if not all(s.index is not None for s in ordered):
            raise ShardError(f"{where}: some shards hold an index of positions and some a range")
        covered = torch.cat([s.index.cpu() for s in ordered])  # type: ignore[union-attr]
        if not torch.equal(covered.sort().values, torch.arange(first.total)):
            raise ShardError(f"{where}: the ranks' indices are not a permutation of {first.dim}[0:{first.total}]")
    dims = []
    for s in ordered:
        try:
            dims.append({k: v for k, v in s.format.validate(s.tensors).items() if k != s.dim})
        except TensorFormatError as exc:
            raise ShardError(f"{where}: rank {s.rank}: {exc}") from None
    for s, d in zip(ordered, dims, strict=True):
        if d != dims[0]:
            raise ShardError(f"{where}: rank {s.rank} has dims {d}, rank 0 has {dims[0]}")
        names = {n for n in s.tensors if not s.parts.get(n, Part()).first_only}
        base = {n for n in ordered[0].tensors if not ordered[0].parts.get(n, Part()).first_only}
        if names != base:
            raise ShardError(f"{where}: rank {s.rank} holds {sorted(names)}, rank 0 holds {sorted(base)}")
        for name in names:
            part = s.parts.get(name, Part())
            if part.axis is None and not torch.equal(s.tensors[name], ordered[0].tensors[name]):
                raise ShardError(f"{where}: {name} is replicated, but rank {s.rank}'s differs from rank 0's")


def unshard(shards: Sequence[Shard]) -> dict[str, torch.Tensor]:
    """The whole layer's stored tensors from a complete set of shards, bit for bit:
    cut tensors concatenated (offsets added back), replicated ones taken once."""
    check_shards(shards)
    ordered = sorted(shards, key=lambda s: s.rank)
    if ordered[0].index is not None:
        raise ShardError(f"{ordered[0].parent.slug} shards: hold scattered positions ({ordered[0].dim} by index); "
                         "unshard puts back range shards only")
    out: dict[str, Any] = {}
    for name, t in ordered[0].tensors.items():
        part = ordered[0].parts.get(name, Part())
        if part.axis is None or part.first_only:
            out[name] = t
            continue
        pieces = []
        for s in ordered:
            p = s.parts[name]
            pieces.append(s.tensors[name] + p.offset if p.offset else s.tensors[name])
        out[name] = torch.cat(pieces, dim=part.axis).to(t.dtype)
    ordered[0].parent.validate(out)
    return out


def shard_of(
    fmt: Format,
    tensors: Mapping[str, torch.Tensor],
    cuts: Mapping[str, tuple[int, int, int] | None],
    *,
    shard_format: Format | None = None,
    dim: str,
    rank: int,
    world: int,
    start: int,
    stop: int,
    total: int,
    offsets: Mapping[str, int] | None = None,
    first_only: Sequence[str] = (),
) -> Shard:
    """Build a :class:`Shard` from per-tensor cuts: ``cuts[name] = (axis, start, length)``
    slices that tensor, ``None`` replicates it; names in ``first_only`` go to rank 0 only;
    ``offsets[name]`` is subtracted from the slice's values. Tensors not in ``cuts`` or
    ``first_only`` are replicated."""
    offsets = offsets or {}
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, Part] = {}
    for name, t in tensors.items():
        if name in first_only:
            parts[name] = Part(axis=None, first_only=True)
            if rank == 0:
                out[name] = t
            continue
        cut = cuts.get(name)
        if cut is None:
            out[name], parts[name] = t, Part()
            continue
        axis, begin, length = cut
        piece = narrow(t, axis, begin, length)
        off = offsets.get(name, 0)
        out[name] = (piece - off).to(t.dtype) if off else piece
        parts[name] = Part(axis=axis, offset=off)
    return Shard(shard_format or fmt, out, fmt, dim, rank, world, start, stop, total, parts)


# --- layers laid end to end along N ------------------------------------------------------------


def concat_of(
    fmt: Format,
    parts: Sequence[Mapping[str, torch.Tensor]],
    axes: Mapping[str, int],
    *,
    names: Sequence[str] | None = None,
) -> dict[str, torch.Tensor]:
    """One layer's stored tensors from ``parts`` (each a layer of ``fmt`` on the same
    input) laid end to end along N: ``axes[name]`` is the axis a tensor's outputs run
    along, and every tensor not in ``axes`` must be bit-equal in every part (a ``g_idx``,
    a rotation, a codebook) and is taken once. ``names`` name the parts in messages.
    Refused (:class:`FusionError`) where the parts differ in K, in the tensors they hold,
    in a dtype or device, or in a shared tensor."""
    labels = list(names) if names is not None else [f"part {i}" for i in range(len(parts))]
    if len(parts) < 1 or len(labels) != len(parts):
        raise FusionError(f"{fmt.slug} concat: expected one or more parts and a name for each, got "
                          f"{len(parts)} part(s) and {len(labels)} name(s)")
    where = f"{fmt.slug} concat of {', '.join(labels)}"
    dims = []
    for label, part in zip(labels, parts, strict=True):
        try:
            dims.append(fmt.validate(part))
        except TensorFormatError as exc:
            raise FusionError(f"{where}: {label}: {exc}") from None
    first, head = parts[0], labels[0]
    for label, part, d in zip(labels, parts, dims, strict=True):
        if d["K"] != dims[0]["K"]:
            raise FusionError(f"{where}: in_features differ ({head} K = {dims[0]['K']}, {label} K = {d['K']})")
        if set(part) != set(first):
            only = sorted(set(part) ^ set(first))
            raise FusionError(f"{where}: {head} holds {sorted(first)}, {label} holds {sorted(part)} "
                              f"(differ in {', '.join(only)})")
        for name, t in part.items():
            ref = first[name]
            if t.dtype != ref.dtype or t.device != ref.device:
                raise FusionError(f"{where}: {name}: {head} has {ref.dtype} on {ref.device}, "
                                  f"{label} has {t.dtype} on {t.device}")
            if name not in axes and not (t.shape == ref.shape and torch.equal(t, ref)):
                raise FusionError(f"{where}: {name} is not cut along N, so it must be the same in every part, "
                                  f"but {label}'s differs from {head}'s")
    out = {name: torch.cat([p[name] for p in parts], dim=axes[name]) if name in axes else t.clone()
           for name, t in first.items()}
    fmt.validate(out)
    return out
