"""Per op: which stored tensors a layer's shard is cut from, what each rank's call reads,
and how the ranks' outputs come back together — as an engine's collectives would:

``N`` (column-parallel)  outputs concatenated along their last dim (an all-gather)
``K`` (row-parallel)     outputs summed, in the activation dtype, one rank after the
                         other (what a ring all-reduce rounds)
``E`` (expert-parallel)  each rank runs the routes of its own experts (others pointed at
                         its first expert and masked to zero), then the same sum

SVDQuant's pre-GEMM, cut along x's channels: codes concatenated along the channels,
block scales along their first dim, the LoRA partial products summed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from quantcore.formats.sharding import Shard
from quantcore.ops.act_quant_lora import ActQuantLoraOutput

__all__ = ["RankCall", "all_reduce_sum", "combine", "rank_call", "stored_tensors"]


def stored_tensors(op: str, weights: Any) -> dict[str, torch.Tensor]:
    """The layer's stored tensors inside a harness's weights object."""
    if op == "moe":
        return weights.up.tensors  # type: ignore[no-any-return]
    return weights.tensors  # type: ignore[no-any-return]


@dataclass(frozen=True)
class RankCall:
    """What one rank's kernel is called with (``args`` after the prepared weights go in
    ``kwargs`` as the harness passes them) and the routes it owns (E only)."""

    x: torch.Tensor
    topk_ids: torch.Tensor | None = None
    topk_weights: torch.Tensor | None = None
    mask: torch.Tensor | None = None  # [T, topk] bool, E only


def rank_call(op: str, shard: Shard, inputs: Any) -> RankCall:
    x = inputs.x
    if shard.index is not None and shard.dim == "K":  # scattered inputs (act-order by groups)
        x = x.index_select(-1, shard.index.to(x.device))
    elif op == "act_quant_lora" or shard.dim == "K":
        x = x[..., shard.start : shard.stop].contiguous()
    if op != "moe":
        return RankCall(x)
    ids, weights = inputs.topk_ids, inputs.topk_weights
    if shard.dim != "E":
        return RankCall(x, ids, weights)
    mine = (ids >= shard.start) & (ids < shard.stop)
    local = torch.where(mine, ids - shard.start, torch.zeros_like(ids))
    if weights is not None:
        weights = weights * mine
    return RankCall(x, local.to(ids.dtype), weights, mine)


def all_reduce_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum in the parts' dtype, one at a time: the roundings of a ring all-reduce."""
    out = parts[0].clone()
    for p in parts[1:]:
        out += p.to(out.device)
    return out


def combine(op: str, dim: str, outputs: Sequence[Any], calls: Sequence[RankCall]) -> Any:
    if op == "act_quant_lora":
        return ActQuantLoraOutput(
            torch.cat([o.qout for o in outputs], dim=1),
            torch.cat([o.oscales for o in outputs], dim=0),
            all_reduce_sum([o.lora_act_out for o in outputs]),
        )
    if dim == "N":
        return torch.cat(list(outputs), dim=-1)
    if dim == "E":
        masked = []
        for out, call in zip(outputs, calls, strict=True):
            if call.topk_weights is None:  # [T, topk, N]: keep the rank's own routes
                assert call.mask is not None
                out = torch.where(call.mask.to(out.device).unsqueeze(-1), out, torch.zeros_like(out))
            masked.append(out)
        outputs = masked
    return all_reduce_sum(outputs)
