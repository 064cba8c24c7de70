"""A shard of ``trtllm_moe_triton``'s prepared state: the preprocessed MoE layout is cut in
place (:mod:`.preprocess.shard`), never undone, with the scales and zeros cut as the
format cuts them. What an engine does with weights it holds only preprocessed (a
TensorRT-LLM engine's, or preprocessed once on one rank and sent out)."""

from __future__ import annotations

import dataclasses

from quantcore.formats.sharding import check_request, even_split, narrow

from .preprocess.shard import shard_preprocessed
from .triton_kernel import MOE_LAYOUT, TritonMoEWeights, stored_row_order

__all__ = ["shard_triton_weights"]


def shard_triton_weights(prepared: TritonMoEWeights, *, dim: str, rank: int, world: int) -> TritonMoEWeights:
    """Rank ``rank``'s part of ``prepared`` cut along ``dim`` ("K", "N" or "E"): equal to
    what ``TritonMoE.prepare`` makes of the format's shard of the stored tensors."""
    check_request("trtllm_moe_triton prepared", dim, rank, world, ("K", "N", "E"))
    zeros = prepared.zeros
    if dim == "E":
        size = even_split("trtllm_moe_triton prepared", "E", prepared.num_experts, world, 1, "")
        return dataclasses.replace(
            prepared,
            layout=narrow(prepared.layout, 0, rank * size, size),
            scales=narrow(prepared.scales, 0, rank * size, size),
            zeros=None if zeros is None else narrow(zeros, 0, rank * size, size),
        )
    gs = prepared.group_size
    layout = shard_preprocessed(MOE_LAYOUT, prepared.layout, dim=dim, rank=rank, world=world,
                                group_size=gs if dim == "K" else 1)
    if dim == "N":
        size = layout.shape[2]
        cut = (2, rank * size, size)
        k_order = prepared.k_order
    else:
        size = layout.shape[1]
        cut = (1, rank * size // gs, -(-size // gs))
        k_order = stored_row_order(size, prepared.k_order.device)
    return TritonMoEWeights(
        layout=layout,
        scales=narrow(prepared.scales, *cut),
        zeros=None if zeros is None else narrow(zeros, *cut),
        k_order=k_order,
        group_size=gs,
    )
