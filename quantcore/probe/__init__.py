"""Device capability probing: ``quantcore.probe("cuda:0")``, cached per device."""

from __future__ import annotations

import functools
import sys
import threading
import types

import torch

from ..errors import InvalidArgumentError
from .capabilities import Capabilities, PackageStatus
from .devices import probe_cpu, probe_cuda, probe_npu, probe_xpu

__all__ = ["KNOWN_DEVICE_TYPES", "Capabilities", "PackageStatus", "normalize_device", "probe"]

_PROBERS = {"cpu": probe_cpu, "cuda": probe_cuda, "xpu": probe_xpu, "npu": probe_npu}
KNOWN_DEVICE_TYPES = tuple(_PROBERS)
_lock = threading.Lock()


def normalize_device(device: str | torch.device) -> str:
    """``"cuda"`` and ``torch.device("cuda", 0)`` both become ``"cuda:0"`` once known.

    Accepts device types torch does not know (``"npu"`` without torch_npu) so that
    asking about them gives an answer, not a parse error.
    """
    index: int | None
    if isinstance(device, torch.device):
        dtype_, index = device.type, device.index
    else:
        text = str(device).strip().lower()
        dtype_, _, idx = text.partition(":")
        if idx and not idx.isdigit():
            raise InvalidArgumentError(f"device: expected 'type' or 'type:index', got {device!r}")
        index = int(idx) if idx else None
    if dtype_ == "cpu":
        return "cpu"
    return f"{dtype_}:{index}" if index is not None else dtype_


@functools.cache
def _probe_cached(device: str) -> Capabilities:
    kind = device.partition(":")[0]
    prober = _PROBERS.get(kind)
    if prober is None:
        return Capabilities(
            device=device,
            device_type=kind,
            available=False,
            reason=f"unknown device type {kind!r}; quantcore probes {', '.join(_PROBERS)}",
            torch_version=torch.__version__,
        )
    return prober(device)


def probe(device: str | torch.device = "cpu") -> Capabilities:
    """What ``device`` offers: probed once, then served from a cache.

    Never raises because something is missing: an absent GPU or library is reported in
    ``available`` / ``reason`` and in each package's status.
    """
    key = normalize_device(device)
    with _lock:
        return _probe_cached(key)


def clear_cache() -> None:
    """Forget probed devices (tests; after changing TRITON_INTERPRET)."""
    _probe_cached.cache_clear()


class _CallableModule(types.ModuleType):
    """``quantcore.probe`` is both this package and the function: importing the package
    (which any ``from quantcore.probe import ...`` does) sets it as the attribute
    ``quantcore.probe``, where ``quantcore.probe("cuda")`` must keep working."""

    def __call__(self, device: str | torch.device = "cpu") -> Capabilities:
        return probe(device)


sys.modules[__name__].__class__ = _CallableModule
