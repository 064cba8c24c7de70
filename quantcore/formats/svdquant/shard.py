"""SVDQuant pre-GEMM shards (the vocabulary is :mod:`quantcore.formats.sharding`'s).

The op's tensors belong to the activation side of a W4A4 linear: ``lora_down [N, R]``
and ``smooth [N]`` along the activation's channels N (the in-features of the W4A4 GEMM
that follows). A shard makes sense where that GEMM is row-parallel: each rank holds a
slice of x's channels and quantizes it on its own. So the one cut is ``dim="N"``:

* rows ``[n0, n1)`` of ``lora_down`` and of ``smooth``; a part must be whole scale blocks
  (16 channels for NVFP4, 64 for INT4), since a block's scale is the max over its
  channels;
* the ranks' ``qout`` columns and ``oscales`` rows are concatenated (bit for bit the
  unsharded op's), and their ``lora_act_out`` summed (x @ lora_down over the channels).

A column-parallel W4A4 linear needs no shard here: every rank quantizes the whole x
with the whole ``lora_down`` (its split is in the W4A4 weight and ``lora_up``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from ..sharding import Shard, even_split, shard_of

if TYPE_CHECKING:
    from .format import SVDQuantAct

__all__ = ["shard_svdquant"]


def shard_svdquant(
    fmt: SVDQuantAct, tensors: Mapping[str, torch.Tensor], *, dim: str, rank: int, world: int
) -> Shard:
    n = fmt.validate(tensors)["N"]
    kind = "NVFP4" if fmt.fp4 else "INT4"
    size = even_split(fmt.slug, "N", n, world, fmt.block, f"whole {kind} scale blocks of {fmt.block} channels")
    n0 = rank * size
    cuts = {"lora_down": (0, n0, size), "smooth": (0, n0, size)}
    return shard_of(fmt, tensors, cuts, dim="N", rank=rank, world=world, start=n0, stop=n0 + size, total=n)
