"""The ``spec`` argument of a kernel's custom op: a JSON string naming the kernel (format,
op, name), the format's parameters, the problem dims the output rule reads, and the tree
that rebuilds the prepared state from the op's ``state`` tensors (:mod:`.state`).

Because a spec carries everything by name, a program that calls the ops runs in another
process too: there the kernel class comes from the registry. A spec made in this process
is remembered with the kernel that made it, so a kernel registered elsewhere (a private
registry) runs as well.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import KernelInputError, PluginError, QuantCoreError, TensorFormatError
from ..formats.base import Format
from ..kernel import Kernel
from ..problem import MAX_DIM
from ..registry import default_registry
from ..tensors import laid_out
from .schema import restore
from .state import FlattenedState, builder, class_path, flatten, unflatten

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
    #: (data_ptr, dtype, shape, stride, device) of each tensor of the states already checked.
    _checked: set[tuple[Any, ...]] = field(default_factory=set)
    #: The tree, read once: builds the prepared state on a checked state's tensors.
    _build: Callable[[Sequence[torch.Tensor]], Any] | None = None

    def kernel(self, device: torch.device) -> Kernel:
        k = self._kernels.get(device)
        if k is None:
            k = self._kernels[device] = self.kernel_cls(self.fmt, device)
        return k

    def prepared(
        self, state: Sequence[torch.Tensor], *, where: str = "spec", names: Sequence[str] | None = None,
        device: torch.device | None = None, one_device: bool = True,
    ) -> Any:
        """The prepared state on ``state``, checked against the kernel's schema for the
        spec's dims (:mod:`.schema`) once per set of tensors; ``names`` are the buffers the
        tensors came from, for the messages."""
        key = tuple((t.data_ptr(), t.dtype, t.shape, t.stride(), t.device) for t in state
                    if isinstance(t, torch.Tensor))
        if len(key) == len(state) and key in self._checked:
            if self._build is None:
                self._build = builder(self.tree, allowed=self.allowed)
            return self._build(state)
        where_device = device if device is not None else (state[0].device if state else torch.device("cpu"))
        prepared = restore(self.kernel(where_device), self.tree, state, self.dims, where=where,
                           allowed=self.allowed, names=names, one_device=one_device)
        if all(laid_out(t) is t for t in state):  # a state that needed copies is checked (and copied) each time
            with _lock:
                if len(self._checked) >= _CHECKED_MAX:
                    self._checked.clear()
                self._checked.add(key)
        return prepared


#: States remembered as checked per spec, at most (a model's layers share few specs).
_CHECKED_MAX = 4096

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
    """A spec from elsewhere (a file, another process): every field checked, the format
    rebuilt through its constructor so its parameters are validated as any other."""
    def bad(why: str) -> TensorFormatError:
        return TensorFormatError(f"spec: {why} (expected the JSON quantcore.custom_ops.make_spec writes, "
                                 f"got {str(spec)[:80]!r})")

    if not isinstance(spec, str):
        raise bad(f"a {type(spec).__name__}, not a string")
    try:
        data = json.loads(spec)
    except ValueError:
        raise bad("not JSON") from None
    if not isinstance(data, dict):
        raise bad("not a JSON object")
    if data.get("v") != SPEC_VERSION:
        raise KernelInputError(f"spec: version {data.get('v')!r}, this quantcore reads version {SPEC_VERSION}")
    ref, dims = data.get("kernel"), data.get("dims")
    if not isinstance(ref, dict) or not all(isinstance(ref.get(k), str) for k in ("format", "op", "name")):
        raise bad("'kernel' must name format, op and name")
    if not isinstance(dims, dict) or not all(isinstance(k, str) and type(v) is int and 0 <= v <= MAX_DIM
                                             for k, v in dims.items()):
        raise bad(f"'dims' must map dim names to sizes in [0, {MAX_DIM}]")
    if not isinstance(data.get("fmt"), dict) or "state" not in data:
        raise bad("'fmt' and 'state' are required")
    cls = default_registry().kernel(ref["format"], ref["op"], ref["name"]).cls
    allowed = _allowed(cls)
    read = unflatten(data["fmt"], (), allowed=allowed, where="spec 'fmt'")
    if not isinstance(read, Format) or not dataclasses.is_dataclass(read):
        raise bad(f"'fmt' describes a {type(read).__name__}, not a Format")
    if type(read).name != cls.format:
        raise bad(f"'fmt' is a {type(read).name} format, the kernel {cls.name} runs {cls.format}")
    try:  # the constructor validates what unflatten set field by field
        fmt = type(read)(**{f.name: getattr(read, f.name) for f in dataclasses.fields(read) if f.init})
    except QuantCoreError as exc:
        raise TensorFormatError(f"spec 'fmt': {exc}") from None
    except (TypeError, ValueError) as exc:
        raise bad(f"'fmt': {exc}") from None
    return Resolved(cls, fmt, dict(dims), data["state"], allowed)


def _allowed(cls: type[Kernel]) -> tuple[str, ...]:
    """The packages a spec's trees may name classes from: quantcore and the kernel's own."""
    return tuple(dict.fromkeys(("quantcore", cls.__module__.split(".")[0])))
