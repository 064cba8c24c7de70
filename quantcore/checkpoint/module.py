"""``QuantLinear``: a quantized linear as a torch module, run by whatever kernel
``get_kernel`` picks for its device; and helpers to quantize a model's linears with a
format's golden quantizer and to swap a model's linears for a checkpoint's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..binding import bind
from ..errors import TensorFormatError
from ..formats.base import Format
from ..kernel import Kernel
from ..problem import Problem
from .loader import Checkpoint

__all__ = ["QuantLinear", "quantize_linears", "replace_linears"]


class QuantLinear(nn.Module):
    """``y = x Wᵀ + b`` with W in ``fmt``; the kernel is chosen once, for ``device``
    and activation ``dtype``, through :func:`quantcore.bind`: one prepare per weight
    however many threads build the module, and a kernel that fails at run time is
    replaced by the next candidate."""

    def __init__(
        self,
        fmt: Format,
        tensors: Mapping[str, torch.Tensor],
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.bfloat16,
        prefer: str | Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        dims = fmt.validate(tensors)
        self.format = fmt
        self.in_features, self.out_features = dims["K"], dims["N"]
        self.dtype = dtype
        device = torch.device(device) if device is not None else next(iter(tensors.values())).device
        problem = Problem.linear(fmt, K=self.in_features, N=self.out_features, dtype=dtype)
        source = {k: v.to(device) for k, v in tensors.items()}
        self.bound = bind(fmt, device, source, problem=problem, dtype=dtype, prefer=prefer)

    @property
    def kernel(self) -> Kernel:
        return self.bound.kernel

    @property
    def prepared(self) -> Any:
        return self.bound.prepared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bound(x)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"format={self.format.slug}, kernel={self.kernel.name}")


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
        q = QuantLinear(ckpt.format, tensors, device=device, dtype=dtype)
        if (q.in_features, q.out_features) != (target.in_features, target.out_features):
            raise TensorFormatError(
                f"{name}: checkpoint linear is {q.in_features}→{q.out_features}, the model's is "
                f"{target.in_features}→{target.out_features}"
            )
        parent_name, _, leaf = local.rpartition(".")
        setattr(modules[parent_name] if parent_name else model, leaf, q)
        done[local] = q
    return done
