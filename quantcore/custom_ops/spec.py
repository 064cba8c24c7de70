"""The ``spec`` argument of a kernel's custom op: a JSON string naming the kernel (format,
op, name), the format's parameters, the problem dims the output rule reads, and the tree
that rebuilds the prepared state from the op's ``state`` tensors (:mod:`.state`).

Because a spec carries everything by name, a program that calls the ops runs in another
process too: there the kernel class comes from the registry. A spec made in this process
is remembered with the kernel that made it, so a kernel registered elsewhere (a private
registry) runs as well.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import KernelInputError, PluginError
from ..formats.base import Format
from ..kernel import Kernel
from ..registry import default_registry
from .state import FlattenedState, class_path, flatten, unflatten

__all__ = ["SPEC_VERSION", "Resolved", "make_spec", "resolve"]

SPEC_VERSION = 1


@dataclass
class Resolved:
    """A spec, read: the kernel class, the format, the dims, the prepared-state tree, and
    one kernel per device to run it."""

    kernel_cls: type[Kernel]
    fmt: Format
    dims: dict[str, int]
    tree: Any
    allowed: tuple[str, ...]
    _kernels: dict[torch.device, Kernel] = field(default_factory=dict)

    def kernel(self, device: torch.device) -> Kernel:
        k = self._kernels.get(device)
        if k is None:
            k = self._kernels[device] = self.kernel_cls(self.fmt, device)
        return k

    def prepared(self, state: Sequence[torch.Tensor]) -> Any:
        return unflatten(self.tree, state, allowed=self.allowed)


_resolved: dict[str, Resolved] = {}
_lock = threading.Lock()


def make_spec(kernel: Kernel, state: FlattenedState, dims: Mapping[str, int]) -> str:
    """The ``spec`` argument of a call of ``kernel`` on ``state`` for a problem of ``dims``."""
    cls = type(kernel)
    fmt = flatten(kernel.fmt, where=f"{kernel.name}.fmt")
    if fmt.tensors:
        raise PluginError(f"format {kernel.fmt.slug}: a format's parameters cannot hold tensors")
    tree = json.loads(state.tree)
    data = {
        "v": SPEC_VERSION,
        "kernel": {"format": cls.format, "op": cls.op, "name": cls.name, "cls": class_path(cls)},
        "fmt": json.loads(fmt.tree),
        "dims": {k: int(v) for k, v in sorted(dims.items())},
        "state": tree,
    }
    spec = json.dumps(data, sort_keys=True, separators=(",", ":"))
    if spec not in _resolved:
        with _lock:
            _resolved.setdefault(spec, Resolved(cls, kernel.fmt, dict(data["dims"]), tree, _allowed(cls),
                                                {kernel.device: kernel}))
    return spec


def resolve(spec: str) -> Resolved:
    hit = _resolved.get(spec)
    if hit is not None:
        return hit
    with _lock:
        hit = _resolved.get(spec)
        if hit is None:
            hit = _resolved[spec] = _read(spec)
    return hit


def _read(spec: str) -> Resolved:
    try:
        data = json.loads(spec)
        ref = data["kernel"]
        version = data["v"]
    except (ValueError, KeyError, TypeError):
        raise KernelInputError(f"spec: expected the JSON quantcore.custom_ops.make_spec writes, got {spec[:80]!r}") from None
    if version != SPEC_VERSION:
        raise KernelInputError(f"spec: version {version}, this quantcore reads version {SPEC_VERSION}")
    cls = default_registry().kernel(ref["format"], ref["op"], ref["name"]).cls
    allowed = _allowed(cls)
    fmt = unflatten(data["fmt"], (), allowed=allowed)
    if not isinstance(fmt, Format):
        raise KernelInputError(f"spec: 'fmt' describes a {type(fmt).__name__}, not a Format")
    return Resolved(cls, fmt, dict(data["dims"]), data["state"], allowed)


def _allowed(cls: type[Kernel]) -> tuple[str, ...]:
    """The packages a spec's trees may name classes from: quantcore and the kernel's own."""
    return tuple(dict.fromkeys(("quantcore", cls.__module__.split(".")[0])))
