"""Decode attention that reads each KV head once, as engines' decode attention does.

transformers' ``sdpa`` attention, given a mask (a static cache always has one) and grouped
KV heads, repeats K and V to one copy per query head before calling torch's
``scaled_dot_product_attention``: a decode step then writes and reads G copies of the
whole cache per layer (G = query heads per KV head). For a single query token that copy
is avoidable: the G query heads that share a KV head become G query rows of that head
(``[B, Hq, 1, D]`` → ``[B, Hkv, G, D]``), and a mask shared by every head (``[B, 1, 1, S]``)
broadcasts over them. Rows of one attention are independent, so the result is the same
attention, computed against the unrepeated cache.

:func:`grouped_sdpa_attention` does that for a single query token whose mask (if any) is
shared by all heads, and hands every other call (prefill, per-head masks, a position bias,
a soft cap) to transformers' own ``sdpa_attention_forward`` unchanged. :func:`register`
makes it a model's ``attn_implementation`` under :data:`NAME`, with transformers' sdpa
mask (a boolean ``[B, 1, L, S]`` mask, True where a position is attended).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from quantcore.errors import MissingDependencyError

__all__ = ["NAME", "grouped_sdpa_attention", "register"]

#: The ``attn_implementation`` name :func:`register` gives it.
NAME = "grouped_sdpa"

#: Arguments of transformers' sdpa attention that packing does not carry: those calls go to it.
_DELEGATED_KWARGS = ("position_bias", "softcap")

#: transformers' ``sdpa_attention_forward``, looked up once (this module imports without transformers).
_sdpa_forward: Callable[..., tuple[torch.Tensor, None]] | None = None


def _transformers_sdpa() -> Callable[..., tuple[torch.Tensor, None]]:
    global _sdpa_forward
    if _sdpa_forward is None:
        try:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward
        except ImportError as exc:
            raise MissingDependencyError(
                f"grouped attention: expected transformers with integrations.sdpa_attention.sdpa_attention_forward, "
                f"got {_version()} ({exc})") from None
        _sdpa_forward = sdpa_attention_forward
    return _sdpa_forward


def _version() -> str:
    try:
        import transformers
    except ImportError:
        return "no transformers"
    return f"transformers {transformers.__version__}"


def _packs(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None,
           kwargs: dict[str, Any]) -> bool:
    """One query token, more query heads than KV heads (a whole number of them each), and
    a mask (if any) that every head shares."""
    heads, kv_heads = query.shape[1], key.shape[1]
    shared_mask = attention_mask is None or (attention_mask.dim() == 4 and attention_mask.shape[1:3] == (1, 1))
    return (query.dim() == 4 and query.shape[2] == 1 and heads > kv_heads and heads % kv_heads == 0
            and shared_mask and all(kwargs.get(k) is None for k in _DELEGATED_KWARGS))


def grouped_sdpa_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
    is_causal: bool | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface function: ``query`` ``[B, Hq, L, D]``, ``key`` and
    ``value`` ``[B, Hkv, S, D]``, ``attention_mask`` ``[B, 1 or Hq, L, S]`` (boolean, True =
    attend, or additive) or None; returns ``([B, L, Hq, Dv], None)``, contiguous, as
    transformers' ``sdpa_attention_forward``, which runs every call but a single query
    token's with a mask shared by all heads."""
    if not _packs(query, key, attention_mask, kwargs):
        return _transformers_sdpa()(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                    is_causal=is_causal, **kwargs)
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    # Head h = k·G + g uses KV head k (repeat_kv's order): its query is row g of head k.
    packed = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=False)
    # The batch is the output's: SDPA broadcasts a batch of 1 against the others.
    out = out.reshape(out.shape[0], heads, 1, value.shape[-1]).transpose(1, 2).contiguous()
    return out, None


def register() -> str:
    """Make :func:`grouped_sdpa_attention` the ``attn_implementation`` :data:`NAME` (with
    transformers' sdpa mask) for every model; returns the name. Idempotent."""
    _transformers_sdpa()
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as exc:
        raise MissingDependencyError(
            f"grouped attention: expected transformers with AttentionInterface and "
            f"masking_utils.AttentionMaskInterface/sdpa_mask (5.x), got {_version()} ({exc})") from None
    AttentionInterface.register(NAME, grouped_sdpa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
