"""A small transformers Llama written as a quantized, sharded checkpoint in the real
layout, and the skeleton it loads into: what the loading tests and the checkpoint fuzz
suite build on (each with its own config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from quantcore.checkpoint import quantize_linears, save_checkpoint

__all__ = ["llama", "skeleton", "write_quantized"]


def llama(config: Any, seed: int = 0) -> nn.Module:
    """``LlamaForCausalLM(config)`` in eval mode, its weights drawn from ``seed``."""
    import transformers

    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def write_quantized(folder: Path, model: nn.Module, fmt: Any, config: Any,
                    shards: int = 3) -> dict[str, dict[str, torch.Tensor]]:
    """Every linear of ``model`` but ``lm_head`` quantized in ``fmt`` (seeded), written with
    the rest of its state into ``folder`` as ``shards`` shards; returns the linears' tensors."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]
    linears = quantize_linears(model, fmt, names, generator=torch.Generator().manual_seed(0))
    covered = {f"{n}.{leaf}" for n in names for leaf in ("weight", "bias")}
    others = {k: v for k, v in model.state_dict().items() if k not in covered}
    save_checkpoint(folder, fmt, linears, others, base_config=config.to_dict(), shards=shards)
    return linears


def skeleton(config: Any) -> nn.Module:
    """The model on meta, but for the rotary frequencies, which are computed, not saved."""
    import transformers

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    model.model.rotary_emb = llama(config).model.rotary_emb
    return model
