"""quantcore: quantized-weight formats, the transforms into kernel layouts, and the
kernels that run them, chosen per device.

    import quantcore
    k = quantcore.get_kernel("gptq", "cpu", problem=...)
    prepared = k.prepare(checkpoint_tensors)
    y = k(x, prepared)
    print(quantcore.explain("gptq", "xpu"))

    quantcore.quantize_(model, GPTQ(bits=4, group_size=128))          # nn.Linear → QuantLinear
    model = quantcore.load_quantized("Llama-3.1-8B-GPTQ", device="cuda")  # a checkpoint folder

``import quantcore`` is cheap: torch, the registry and every backend load on first use
(PEP 562 lazy attributes), and triton or cuda.tile only when a kernel that needs them
runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY: dict[str, tuple[str, str]] = {
    "get_kernel": ("quantcore.selection", "get_kernel"),
    "bind": ("quantcore.binding", "bind"),
    "BoundKernel": ("quantcore.binding", "BoundKernel"),
    "explain": ("quantcore.selection", "explain"),
    "Explanation": ("quantcore.selection", "Explanation"),
    "probe": ("quantcore.probe", "probe"),
    "Capabilities": ("quantcore.probe", "Capabilities"),
    "register": ("quantcore.registry", "register"),
    "unregister": ("quantcore.registry", "unregister"),
    "default_registry": ("quantcore.registry", "default_registry"),
    "hookimpl": ("quantcore.registry", "hookimpl"),
    "get_format": ("quantcore.api", "get_format"),
    "quantize_": ("quantcore.nn.quantize", "quantize_"),
    "fuse_projections": ("quantcore.nn.fuse", "fuse_projections"),
    "load_quantized": ("quantcore.checkpoint.load", "load_quantized"),
    "QuantLinear": ("quantcore.nn.linear", "QuantLinear"),
    "KernelOp": ("quantcore.custom_ops", "KernelOp"),
    "list_plugins": ("quantcore.api", "list_plugins"),
    "Problem": ("quantcore.problem", "Problem"),
    "Format": ("quantcore.formats.base", "Format"),
    "Kernel": ("quantcore.kernel", "Kernel"),
    "LinearKernel": ("quantcore.kernel", "LinearKernel"),
    "Requirements": ("quantcore.kernel", "Requirements"),
    "Support": ("quantcore.kernel", "Support"),
    "Transform": ("quantcore.transform", "Transform"),
    "QuantCoreError": ("quantcore.errors", "QuantCoreError"),
    "QuantCoreWarning": ("quantcore.errors", "QuantCoreWarning"),
    "NoKernelError": ("quantcore.errors", "NoKernelError"),
    "FusionError": ("quantcore.errors", "FusionError"),
    "TensorFormatError": ("quantcore.errors", "TensorFormatError"),
    "KernelInputError": ("quantcore.errors", "KernelInputError"),
    "MissingDependencyError": ("quantcore.errors", "MissingDependencyError"),
    "InvalidArgumentError": ("quantcore.errors", "InvalidArgumentError"),
    "ShardError": ("quantcore.errors", "ShardError"),
    "UnknownFormatError": ("quantcore.errors", "UnknownFormatError"),
    "UnsupportedProblemError": ("quantcore.errors", "UnsupportedProblemError"),
}

#: Submodules reachable as attributes, imported on first use (``quantcore.hf`` imports transformers).
_SUBMODULES = ("hf",)

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'quantcore' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:
    from .api import get_format, list_plugins
    from .binding import BoundKernel, bind
    from .checkpoint.load import load_quantized
    from .custom_ops import KernelOp
    from .errors import (
        FusionError,
        InvalidArgumentError,
        KernelInputError,
        MissingDependencyError,
        NoKernelError,
        QuantCoreError,
        QuantCoreWarning,
        ShardError,
        TensorFormatError,
        UnknownFormatError,
        UnsupportedProblemError,
    )
    from .formats.base import Format
    from .kernel import Kernel, LinearKernel, Requirements, Support
    from .nn.fuse import fuse_projections
    from .nn.linear import QuantLinear
    from .nn.quantize import quantize_
    from .probe import Capabilities, probe
    from .problem import Problem
    from .registry import default_registry, hookimpl, register, unregister
    from .selection import Explanation, explain, get_kernel
    from .transform import Transform
