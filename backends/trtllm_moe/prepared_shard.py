"""A shard of ``trtllm_moe_triton``'s prepared state: the preprocessed MoE layout is cut in
place (:mod:`.preprocess.shard`), never undone, with the scales and zeros cut as the
format cuts them. What an engine does with weights it holds only preprocessed (a
TensorRT-LLM engine's, or preprocessed once on one rank and sent out).

The prepared state's own module (``triton_kernel``) calls this with its layout, so neither
module imports the other's internals. The kernel reads the layout's rows in their
stored order (a closed form within each 64-row chunk), so a cut on chunk boundaries
needs no row map."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from quantcore.formats.sharding import check_request, even_split, narrow

from .preprocess.preprocessor import CutlassMixedGemmLayout
from .preprocess.shard import shard_preprocessed

__all__ = ["shard_prepared_moe"]

P = TypeVar("P")


def shard_prepared_moe(
    prepared: P,
    layout: CutlassMixedGemmLayout,
    *,
    dim: str,
    rank: int,
    world: int,
) -> P:
    """Rank ``rank``'s part of ``prepared`` (a dataclass with ``layout``, ``scales``,
    ``zeros`` and ``group_size``) cut along ``dim`` ("K", "N" or "E"): equal
    to what ``prepare`` makes of the format's shard of the stored tensors."""
    where = "trtllm_moe_triton prepared"
    check_request(where, dim, rank, world, ("K", "N", "E"))
    p: Any = prepared
    zeros = p.zeros
    if dim == "E":
        size = even_split(where, "E", p.layout.shape[0], world, 1, "")
        cut: tuple[int, int, int] = (0, rank * size, size)
        return dataclasses.replace(  # type: ignore[type-var]
            p, layout=narrow(p.layout, *cut), scales=narrow(p.scales, *cut),
            zeros=None if zeros is None else narrow(zeros, *cut),
        )
    gs = p.group_size
    cut_layout = shard_preprocessed(layout, p.layout, dim=dim, rank=rank, world=world,
                                    group_size=gs if dim == "K" else 1)
    if dim == "N":
        size = cut_layout.shape[2]
        cut = (2, rank * size, size)
    else:
        size = cut_layout.shape[1]
        cut = (1, rank * size // gs, -(-size // gs))
    return dataclasses.replace(  # type: ignore[type-var]
        p, layout=cut_layout, scales=narrow(p.scales, *cut), zeros=None if zeros is None else narrow(zeros, *cut),
    )
