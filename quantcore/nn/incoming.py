"""A module's prepared state as a state dict hands it back, read without trusting it.

``_extra_state`` is ``{"version", "spec", "names"}``: the spec (:mod:`quantcore.custom_ops.spec`)
names the kernel, the format, the dims and the tree of the prepared state; ``names`` are
the buffers that fill the tree's tensors, in order. Before any buffer is loaded:

* :func:`read_extra_state` checks each field, and that the spec describes this module's
  format and dims and an op of its kind;
* :func:`check_incoming` checks the buffers against the kernel's prepared schema where
  they will be held (:mod:`quantcore.custom_ops.schema`), and that each name names the
  place in the prepared state it fills — so two buffers of one shape cannot stand in for
  each other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..custom_ops import flatten, resolve
from ..errors import TensorFormatError
from ..formats.base import Format

__all__ = ["EXTRA_STATE_VERSION", "SOURCE", "check_incoming", "read_extra_state"]

EXTRA_STATE_VERSION = 1
#: Buffer-name prefix of the kept source tensors (never in the state dict).
SOURCE = "source_"
#: The prefix a buffer name takes where its plain name is an attribute of the module.
TAKEN_PREFIX = "state_"


def read_extra_state(
    extra: Any, where: str, *, fmt: Format, dims: Mapping[str, int], op: str, usable: Callable[[str], bool]
) -> tuple[str, tuple[str, ...]]:
    """The (spec, buffer names) an ``_extra_state`` describes, for a module of ``fmt``,
    ``dims`` and op kind ``op``; ``usable(name)``: whether a buffer may have that name."""
    if not isinstance(extra, Mapping):
        raise TensorFormatError(f"{where}._extra_state: expected a dict with version, spec and names, "
                                f"got {type(extra).__name__}")
    if extra.get("version") != EXTRA_STATE_VERSION:
        raise TensorFormatError(f"{where}._extra_state: version {extra.get('version')!r}, "
                                f"expected {EXTRA_STATE_VERSION}")
    spec, names = extra.get("spec"), extra.get("names")
    if spec == "" and names == []:
        return "", ()  # a module saved before it had a weight
    if not isinstance(spec, str) or not isinstance(names, (list, tuple)):
        raise TensorFormatError(f"{where}._extra_state: expected spec (a string) and names (a list), "
                                f"got {type(spec).__name__} and {type(names).__name__}")
    bad = [n for n in names if not isinstance(n, str) or not n.isidentifier() or n.startswith(SOURCE)
           or n == "_extra_state" or not usable(n)]
    if bad or len(set(names)) != len(names):
        raise TensorFormatError(f"{where}._extra_state: names: expected distinct buffer names, got {bad or names!r}")
    r = resolve(spec)
    if r.fmt != fmt or any(r.dims.get(k) != v for k, v in dims.items()):
        raise TensorFormatError(
            f"{where}: the state dict holds a {r.fmt.slug} weight of {r.dims}, the module is {fmt.slug} of {dict(dims)}"
        )
    if r.kernel_cls.op != op:
        raise TensorFormatError(f"{where}._extra_state: spec names a {r.kernel_cls.op} kernel, the module runs {op}")
    return spec, tuple(names)


def check_incoming(
    spec: str, names: Sequence[str], given: Sequence[Any], *, prefix: str, where: str, assign: bool,
    module_device: torch.device,
) -> None:
    """The buffers ``given`` (by ``names``) against the kernel's schema where the module
    will hold them (on ``module_device``; with ``assign``, where they are); unchecked where
    the kernel cannot run (a module there is blocked, and checks them when it moves where
    it can)."""
    missing = [n for n, t in zip(names, given, strict=True) if t is None]
    if missing:
        raise TensorFormatError(f"{prefix}{missing[0]}: missing from the state dict; its _extra_state names "
                                f"this buffer of the prepared state")
    for n, t in zip(names, given, strict=True):
        if not isinstance(t, torch.Tensor):
            raise TensorFormatError(f"{prefix}{n}: expected a tensor, got {type(t).__name__}")
    device = given[0].device if assign and given else module_device
    on_meta = [t.device.type == "meta" for t in given]
    if any(on_meta) and not (all(on_meta) and device.type == "meta"):
        n = names[on_meta.index(True)]
        raise TensorFormatError(f"{prefix}{n}: a meta tensor holds no data, and the state's other buffers (or the "
                                f"module, on {device}) do")
    r = resolve(spec)
    if device.type == "meta" or device.type not in r.kernel_cls.requires.device_types:
        return
    state = [t if t.device == device else t.to(device) for t in given]
    prepared = r.prepared(state, where=where, names=[prefix + n for n in names], device=device)
    canonical = flatten(prepared, where=where).names
    if any(n not in (c, TAKEN_PREFIX + c) for n, c in zip(names, canonical, strict=True)):
        raise TensorFormatError(f"{where}._extra_state: names {list(names)} do not name the places of the "
                                f"prepared state they fill ({list(canonical)})")
