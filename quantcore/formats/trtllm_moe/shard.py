"""Tensor-parallel and expert-parallel shards of the trtllm_moe format's logical tensors
(the vocabulary is :mod:`quantcore.formats.sharding`'s). The preprocessed CUTLASS layout
a kernel reads is cut by its own rule, beside it (``backends/trtllm_moe/preprocess/shard.py``).

``dim="N"``  every expert's output columns: ``qweight [E, K, N]``, ``scales`` and ``zeros``
             ``[E, G, N]`` along N. Any part size is a valid tensor set (kernels add their
             own limits, e.g. the Triton kernel's N % 32). A gated W1 ``[E, K, 2·I]`` is cut
             half by half with ``index=merged_index((I, I), rank, world)``, so that each
             SwiGLU pair (column j and I + j) stays on one rank, as TensorRT-LLM's loaders
             cut it; W2 ``[E, I, K]`` is then cut along K by the same ``[r·I/w, (r+1)·I/w)``.
``dim="K"``  every expert's reduction rows, whole groups: ``qweight`` rows ``[k0, k1)``,
             groups ``[k0/gs, k1/gs)`` of ``scales`` and ``zeros``. The routed outputs of the
             ranks are summed.
``dim="E"``  whole experts ``[e0, e1)``: each rank runs the routes of its own experts
             (ids minus e0), and the routes' outputs are gathered back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from ...errors import ShardError
from ..sharding import Part, Shard, even_split, shard_of

if TYPE_CHECKING:
    from .format import TRTLLMMoE

__all__ = ["shard_trtllm_moe"]


def shard_trtllm_moe(
    fmt: TRTLLMMoE,
    tensors: Mapping[str, torch.Tensor],
    *,
    dim: str,
    rank: int,
    world: int,
    index: torch.Tensor | None = None,
) -> Shard:
    dims = fmt.validate(tensors)
    total = dims[dim]
    if index is not None:
        return _columns_by_index(fmt, tensors, total, index, rank, world)
    if dim == "K":
        gs = fmt.group_size
        size = even_split(fmt.slug, "K", total, world, gs, f"whole groups of {gs} rows")
        start = rank * size
        cut = (1, start // gs, fmt.num_groups(size))
        cuts = {"qweight": (1, start, size), "scales": cut, "zeros": cut}
    else:
        size = even_split(fmt.slug, dim, total, world, 1, "")
        start = rank * size
        axis = 0 if dim == "E" else 2
        cuts = dict.fromkeys(("qweight", "scales", "zeros"), (axis, start, size))
    return shard_of(fmt, tensors, cuts, dim=dim, rank=rank, world=world, start=start, stop=start + size, total=total)


def _columns_by_index(
    fmt: TRTLLMMoE, tensors: Mapping[str, torch.Tensor], n: int, index: torch.Tensor, rank: int, world: int
) -> Shard:
    where = f"{fmt.slug} shard"
    if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype.is_floating_point or index.dtype == torch.bool:
        raise ShardError(f"{where}: index: expected a 1-D integer tensor of outputs, got {index!r:.60}")
    idx = index.to(device=tensors["qweight"].device, dtype=torch.int64)
    size = idx.numel()
    if size == 0 or int(idx.min()) < 0 or int(idx.max()) >= n or torch.unique(idx).numel() != size:
        raise ShardError(f"{where}: index: expected distinct outputs in [0, {n}), got {size} values"
                         + (f" in [{int(idx.min())}, {int(idx.max())}]" if size else ""))
    out = {name: t.index_select(2, idx) for name, t in tensors.items()}
    return Shard(fmt, out, fmt, "N", rank, world, rank * size, (rank + 1) * size, n,
                 dict.fromkeys(out, Part(axis=2)), index=index)
