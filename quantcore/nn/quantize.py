"""``quantcore.quantize_``: quantize a model's ``nn.Linear`` layers in place, torchao style.

    quantcore.quantize_(model, GPTQ(bits=4, group_size=128))
    quantcore.quantize_(model, TurboQuant(bits=4), filter_fn=lambda m, name: "mlp" in name)

Each selected layer's weight goes through the format's golden quantizer on the layer's
device and the layer is replaced by the module that runs the format
(:class:`~quantcore.nn.linear.QuantLinear`, :class:`~quantcore.nn.turboquant.TurboQuantLinear`,
:class:`~quantcore.nn.svdquant.SVDQuantLinear`), bound to the best kernel for that device
and the layer's dtype. A layer the format cannot take (a shape its group size does not
divide) or no kernel can run stays dense, and one warning at the end lists them with
the reasons. With ``fuse=True`` linears that read the same input (q/k/v, gate/up) become
one quantized linear along N (:mod:`quantcore.nn.fuse`).
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..checkpoint.dense_copies import warn_dense_copies
from ..errors import (
    InvalidArgumentError,
    KernelInputError,
    NoKernelError,
    QuantCoreWarning,
    TensorFormatError,
    UnsupportedProblemError,
)
from ..formats.base import Format
from ..formats.svdquant import SVDQuantAct
from ..formats.turboquant import TurboQuant
from .linear import QuantLinear
from .svdquant import SVDQuantLinear
from .turboquant.module import TurboQuantLinear

__all__ = ["quantize_"]

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: What leaves a layer dense instead of failing the whole model.
_SKIPPABLE = (TensorFormatError, KernelInputError, UnsupportedProblemError, NoKernelError)


def quantize_(
    model: nn.Module,
    fmt: Format,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
    *,
    dtype: torch.dtype | None = None,
    prefer: str | Sequence[str] | None = None,
    keep_source: bool = False,
    seed: int = 0,
    fuse: bool = False,
) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` for which ``filter_fn(module, name)`` holds
    (all of them by default) by its quantized module; returns ``model``. ``dtype`` is the
    activation dtype the kernels are prepared for (default: each layer's weight dtype).
    Random choices of a quantizer (TurboQuant's rotations) are seeded per layer from
    ``seed`` and the layer's name, so a run repeats. ``fuse=True`` quantizes each group of
    projections that read the same input as one layer (:mod:`quantcore.nn.fuse`; its
    parts share one seed), and warns once for the groups it cannot fuse."""
    if fmt.op != "linear" and not isinstance(fmt, SVDQuantAct):
        raise InvalidArgumentError(
            f"fmt: quantize_ quantizes nn.Linear layers; {fmt.slug} is a {fmt.op} format (use its module)"
        )
    chosen = [(name, m) for name, m in model.named_modules()
              if type(m) is nn.Linear and (filter_fn is None or filter_fn(m, name))]
    left_dense: dict[str, str] = {}
    existing = {id(m) for m in model.modules()}
    fused: set[str] = set()
    if fuse:
        from .fuse import quantize_fused, refusal_warning

        fused, unfused, groups = quantize_fused(
            model, fmt, dict(chosen), dtype_of=lambda linear: _activation_dtype(linear, dtype),
            generator_of=lambda name: _generator(seed, name), prefer=prefer, keep_source=keep_source)
        refusal_warning(unfused, where="quantize_", total=groups)
    for name, linear in chosen:
        if name in fused:
            continue
        layer_dtype = _activation_dtype(linear, dtype)
        gen = _generator(seed, name)
        try:
            new = _quantized(linear, fmt, layer_dtype, gen, prefer, keep_source)
        except _SKIPPABLE as exc:
            left_dense[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            continue
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, new)
    if left_dense:
        listed = "; ".join(f"{n} ({why})" for n, why in list(left_dense.items())[:5])
        more = f"; and {len(left_dense) - 5} more" if len(left_dense) > 5 else ""
        warnings.warn(f"quantize_: {len(left_dense)} of {len(chosen)} linear layers left dense for {fmt.slug}: "
                      f"{listed}{more}", QuantCoreWarning, stacklevel=2)
    made = [(n, m) for n, m in model.named_modules() if id(m) not in existing and hasattr(m, "kernel")]
    warn_dense_copies(made, f"quantize_ {fmt.slug}")
    return model


def _activation_dtype(linear: nn.Linear, dtype: torch.dtype | None) -> torch.dtype:
    return dtype or (linear.weight.dtype if linear.weight.dtype in ACT_DTYPES else torch.bfloat16)


def _generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 0x9E3779B1 + zlib.crc32(name.encode())) % 2**63)


def _quantized(
    linear: nn.Linear, fmt: Format, dtype: torch.dtype, gen: torch.Generator,
    prefer: str | Sequence[str] | None, keep_source: bool,
) -> nn.Module:
    if isinstance(fmt, TurboQuant):
        return TurboQuantLinear.from_linear(linear, fmt, generator=gen, dtype=dtype, keep_source=keep_source,
                                            prefer=prefer)
    if isinstance(fmt, SVDQuantAct):  # the pre-GEMM takes 16-bit activations; the module casts
        act_dtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        return SVDQuantLinear.from_linear(linear, fmt, dtype=act_dtype, prefer=prefer)
    weight = linear.weight.detach()
    tensors = dict(fmt.quantize(weight.float(), generator=gen))
    if linear.bias is not None:
        tensors["bias"] = linear.bias.detach().to(torch.float32)
    return QuantLinear(fmt, tensors, device=weight.device, dtype=dtype, prefer=prefer, keep_source=keep_source)
