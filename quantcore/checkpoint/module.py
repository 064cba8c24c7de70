"""Helpers over :class:`~quantcore.nn.linear.QuantLinear` (re-exported here): quantize a
model's linears with a format's golden quantizer, and swap a model's linears for a
checkpoint's."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..errors import TensorFormatError
from ..formats.base import Format
from ..nn.linear import QuantLinear
from .loader import Checkpoint

__all__ = ["QuantLinear", "quantize_linears", "replace_linears"]


def _linears(model: nn.Module, names: Iterable[str] | None) -> dict[str, nn.Linear]:
    found = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    if names is None:
        return found
    wanted = list(names)
    missing = [n for n in wanted if n not in found]
    if missing:
        raise KeyError(f"no nn.Linear named {missing[0]!r} in the model")
    return {n: found[n] for n in wanted}


def quantize_linears(
    model: nn.Module, fmt: Format, names: Iterable[str] | None = None, **quantize_kwargs: Any
) -> dict[str, dict[str, torch.Tensor]]:
    """Every (or each named) ``nn.Linear`` of ``model`` through ``fmt``'s golden
    quantizer: ``{module name: stored tensors}``, bias kept in fp16 as checkpoints do."""
    out = {}
    for name, linear in _linears(model, names).items():
        tensors = dict(fmt.quantize(linear.weight.detach().float().cpu(), **quantize_kwargs))
        if linear.bias is not None:
            tensors["bias"] = linear.bias.detach().cpu().to(torch.float16)
        out[name] = tensors
    return out


def replace_linears(
    model: nn.Module,
    ckpt: Checkpoint,
    *,
    prefix: str = "",
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, QuantLinear]:
    """Swap each ``nn.Linear`` of ``model`` whose name (after ``prefix``) is a linear of
    ``ckpt`` for a :class:`QuantLinear`; every checkpoint linear must find its module."""
    modules = dict(model.named_modules())
    done = {}
    for name, tensors in sorted(ckpt.linears.items()):
        local = name.removeprefix(prefix) if prefix and name.startswith(prefix) else name
        target = modules.get(local)
        if not isinstance(target, nn.Linear):
            raise TensorFormatError(f"{name}: the model has no nn.Linear named {local!r}")
        q = QuantLinear(ckpt.format_of(name), tensors, device=device, dtype=dtype)
        if (q.in_features, q.out_features) != (target.in_features, target.out_features):
            raise TensorFormatError(
                f"{name}: checkpoint linear is {q.in_features}→{q.out_features}, the model's is "
                f"{target.in_features}→{target.out_features}"
            )
        parent_name, _, leaf = local.rpartition(".")
        setattr(modules[parent_name] if parent_name else model, leaf, q)
        done[local] = q
    return done
