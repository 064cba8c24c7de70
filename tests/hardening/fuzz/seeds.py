"""Seed material, drawn from what the registry holds: for every format parameterisation
a conformance case names (a plugin's cases included) and each set of options, its
smallest case, and the stored tensors the case's harness quantizes for it. A new format
is fuzzed the day it brings conformance cases; nothing here names a format."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import torch

from quantcore.formats.base import Format
from quantcore.kernel import Kernel
from quantcore.ops.case import Case
from quantcore.ops.harness import get_harness
from quantcore.probe import probe
from quantcore.registry import KernelEntry, Registry

from .profiles import DEVICE  # the fuzz device (QUANTCORE_FUZZ_DEVICE)

__all__ = [
    "DEVICE",
    "find_stored_tensors",
    "format_classes",
    "registry",
    "runnable_kernels",
    "seed_cases",
    "seed_tensors",
    "seeds_for",
]

#: Seeds larger than this many stored weight elements are left to the conformance matrix.
MAX_WEIGHT_ELEMENTS = 1 << 17


@functools.cache
def registry() -> Registry:
    """Everything installed (the example plugin too): every kernel is fuzzed."""
    return Registry().load()


def _weight_elements(case: Case) -> int:
    dims = dict(case.dims)
    return math.prod(dims[d] for d in case.weight_dims if d in dims)


def _option_key(case: Case) -> str:
    """The options that change the stored tensors (a bias, a smooth) as one sortable key."""
    return ",".join(f"{k}={v}" for k, v in sorted(case.options) if v)


def _seed_key(case: Case) -> tuple[Any, ...]:
    """Smallest first, but a weight with elements before an empty one (a LoRA rank 0
    would leave a whole tensor unfuzzed)."""
    elements = _weight_elements(case)
    return (elements == 0, elements, math.prod(v for _, v in case.dims), len(case.options), case.id)


@functools.cache
def seed_cases() -> tuple[Case, ...]:
    """One case per format parameterisation (slug) and set of options (a bias, a smooth):
    the smallest."""
    best: dict[tuple[str, str], Case] = {}
    for case in registry().conformance_cases():
        if not isinstance(case, Case) or _weight_elements(case) > MAX_WEIGHT_ELEMENTS:
            continue
        try:
            get_harness(case.op)
        except KeyError:
            continue
        variant = (case.format.slug, _option_key(case))
        old = best.get(variant)
        if old is None or _seed_key(case) < _seed_key(old):
            best[variant] = case
    return tuple(best[v] for v in sorted(best))


def seeds_for(format_name: str | None = None, op: str | None = None) -> tuple[Case, ...]:
    return tuple(
        c for c in seed_cases()
        if (format_name is None or c.format.name == format_name) and (op is None or c.op == op)
    )


def find_stored_tensors(obj: Any, depth: int = 0) -> dict[str, torch.Tensor] | None:
    """The stored tensors inside what a harness's ``weights()`` returned: the first
    ``dict[str, Tensor]`` found in it (dataclass fields, then mapping values)."""
    if isinstance(obj, Mapping) and obj and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        return dict(obj)
    if depth > 3:
        return None
    children: list[Any] = []
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif isinstance(obj, (tuple, list)):
        children = list(obj)
    for child in children:
        found = find_stored_tensors(child, depth + 1)
        if found is not None:
            return found
    return None


@functools.cache
def _seed_weights(case: Case) -> Any:
    return get_harness(case.op).weights(case)


def seed_tensors(case: Case) -> dict[str, torch.Tensor]:
    """A fresh dict (the tensors are shared and must not be written to)."""
    found = find_stored_tensors(_seed_weights(case))
    if found is None:
        raise RuntimeError(f"{case.id}: the {case.op} harness's weights hold no dict of stored tensors")
    return found


def format_classes() -> dict[str, type[Format]]:
    return registry().formats()


def runnable_kernels(device: str = DEVICE) -> list[KernelEntry]:
    """Kernels whose device requirements this machine's ``device`` meets (on a CPU,
    Triton kernels run under the interpreter when ``TRITON_INTERPRET=1``)."""
    caps = probe(device)
    out = []
    for entry in registry().kernels():
        try:
            if entry.cls.check_device(caps) is None:
                out.append(entry)
        except Exception:  # a kernel whose checks raise is not one we can run
            continue
    return sorted(out, key=lambda e: (e.cls.format, e.cls.op, e.cls.name))


def make_kernel(entry: KernelEntry, fmt: Format, device: str = DEVICE) -> Kernel:
    return entry.cls(fmt, torch.device(device))

