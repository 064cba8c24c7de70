"""Tensor-parallel and expert-parallel shards of the trtllm_moe format's logical tensors
(the vocabulary is :mod:`quantcore.formats.sharding`'s). The preprocessed CUTLASS layout
a kernel reads is cut by its own rule, beside it (``backends/trtllm_moe/preprocess/shard.py``).

``dim="N"``  every expert's output columns: ``qweight [E, K, N]``, ``scales`` and ``zeros``
             ``[E, G, N]`` along N. Any part size is a valid tensor set (kernels add their
             own limits, e.g. the Triton kernel's N % 32). For a gated W1 ``[E, K, 2·I]``
             cut each half (``[…, :I]`` and ``[…, I:]``) and concatenate rank r's halves, as
             TensorRT-LLM's loaders do, so that the SwiGLU pairs stay on one rank.
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

from ..sharding import Shard, even_split, shard_of

if TYPE_CHECKING:
    from .format import TRTLLMMoE

__all__ = ["shard_trtllm_moe"]


def shard_trtllm_moe(
    fmt: TRTLLMMoE, tensors: Mapping[str, torch.Tensor], *, dim: str, rank: int, world: int
) -> Shard:
    dims = fmt.validate(tensors)
    total = dims[dim]
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
