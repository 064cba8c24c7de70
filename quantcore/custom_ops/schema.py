"""A prepared state handed back — a module's state dict, a custom op's ``state`` and
``spec`` — is checked against what its kernel's ``prepare`` makes before any op reads it.

What ``prepare`` makes is the kernel's prepared schema (:meth:`Kernel.prepared_schema`,
:mod:`quantcore.schema`), or, where a kernel declares none, derived here: the weights the
op's harness draws for these dims (with and without each optional tensor, such as a
bias) are prepared with no dtype and with every float activation dtype, and a state must
equal one of the results in structure, plain values, dtypes and shapes. Either way a
state whose buffer is truncated, of another dtype or shape, or whose spec names other
sizes than its tensors have, is a :class:`~quantcore.errors.TensorFormatError` naming
the buffer, never an op reading past its end.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..errors import QuantCoreError, TensorFormatError
from ..kernel import Kernel
from ..ops import get_op
from ..ops.case import Case
from ..ops.harness import get_harness
from ..schema import describe_tensor, mismatch
from ..tensors import laid_out
from .state import flatten, tensor_count, unflatten

__all__ = ["check_prepared", "expected_schema", "restore"]

#: The activation dtypes a derived schema prepares for (besides none).
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class Derived:
    """A derived schema: every (tree, tensor dtypes and shapes) prepare made."""

    def __init__(self, kernel: str, dims: Mapping[str, int], variants: set[tuple[str, tuple[Any, ...]]]) -> None:
        self.kernel, self.dims, self.variants = kernel, dict(dims), variants

    def mismatch(self, prepared: Any, name: Callable[[torch.Tensor], str]) -> str | None:
        try:
            state = flatten(prepared, where="prepared")
        except QuantCoreError as exc:
            return str(exc)
        metas = tuple((t.dtype, tuple(t.shape)) for t in state.tensors)
        if (state.tree, metas) in self.variants:
            return None
        same_tree = [m for tree, m in self.variants if tree == state.tree]
        if not same_tree:
            return f"prepared: its structure is not one {self.kernel}.prepare makes for {self.dims}"
        want = same_tree[0]
        for t, (dtype, shape), label in zip(state.tensors, want, state.names, strict=True):
            if t.dtype != dtype or tuple(t.shape) != shape:
                return f"{name(t) or label}: expected {str(dtype).removeprefix('torch.')} {list(shape)}, " \
                       f"got {describe_tensor(t)}"
        return f"prepared: its tensors are not what {self.kernel}.prepare makes for {self.dims}"


_schemas: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()


def expected_schema(kernel: Kernel, dims: Mapping[str, int]) -> Any:
    """The kernel's declared schema for a weight of ``dims``, or the derived one."""
    key = (type(kernel), kernel.fmt, tuple(sorted(dims.items())), kernel.device)
    hit = _schemas.get(key)
    if hit is None:
        declared = kernel.prepared_schema(dict(dims))
        hit = declared if declared is not None else _derive(kernel, dims)
        with _lock:
            _schemas[key] = hit
    return hit


def _derive(kernel: Kernel, dims: Mapping[str, int]) -> Derived:
    harness = get_harness(kernel.op)
    variants: set[tuple[str, tuple[Any, ...]]] = set()
    refusals: list[str] = []
    flags = harness.weight_options
    for chosen in itertools.product((False, True), repeat=len(flags)):
        options = tuple((f, True) for f, on in zip(flags, chosen, strict=True) if on)
        case = Case(kernel.fmt, tuple(sorted(dims.items())), torch.float32, options=options,
                    weight_dims=tuple(dims))
        try:
            stored = {n: t.to(kernel.device) for n, t in harness.stored(harness.weights(case)).items()}
        except QuantCoreError as exc:
            refusals.append(str(exc))
            continue
        for dtype in (None, *FLOAT_DTYPES):
            try:
                state = flatten(kernel.prepare(stored, dtype=dtype), where=f"{kernel.name}.prepare()")
            except Exception as exc:  # a kernel that cannot prepare here: no schema, said below
                refusals.append(f"{type(exc).__name__}: {exc}")
                continue
            variants.add((state.tree, tuple((t.dtype, tuple(t.shape)) for t in state.tensors)))
    if not variants:
        raise TensorFormatError(
            f"{kernel.name}: prepares no {kernel.fmt.slug} weight of {dict(dims)} on {kernel.device}, so a prepared "
            f"state cannot be checked against it ({refusals[0] if refusals else 'no weight'})"
        )
    return Derived(kernel.name, dims, variants)


def check_prepared(
    kernel: Kernel, dims: Mapping[str, int], prepared: Any, *, where: str,
    names: Mapping[int, str] | None = None,
) -> None:
    """Raise :class:`TensorFormatError` unless ``prepared`` is what ``kernel.prepare``
    makes for a weight of ``dims``; ``names`` maps ``id(tensor)`` to the buffer it came from."""
    def name(t: torch.Tensor) -> str:
        return (names or {}).get(id(t), "")

    schema = expected_schema(kernel, dims)
    if isinstance(schema, Derived):
        problem = schema.mismatch(prepared, name)
    else:
        problem = mismatch(schema, prepared, name=lambda t: name(t) or _path_name(prepared, t))
    if problem:
        raise TensorFormatError(f"{where}: {problem} (what {kernel.name}.prepare makes for {dict(dims)})")


def _path_name(prepared: Any, t: torch.Tensor) -> str:
    state = flatten(prepared, where="prepared")
    for tensor, label in zip(state.tensors, state.names, strict=True):
        if tensor is t:
            return label
    return "prepared"


def restore(
    kernel: Kernel, tree: Any, state: Sequence[Any], dims: Mapping[str, int], *, where: str,
    allowed: Sequence[str], names: Sequence[str] | None = None, one_device: bool = True,
) -> Any:
    """The prepared object ``tree`` describes with ``state`` in place of its tensors,
    checked against ``kernel``'s schema for a weight of ``dims`` (the op's weight dims).
    ``allowed``: the packages the tree may name classes from; ``names``: the buffers
    ``state`` came from, for the messages; ``one_device=False`` lets some stay in host
    memory (an offloaded pass)."""
    labels = list(names) if names is not None else [f"state[{i}]" for i in range(len(state))]
    for label, t in zip(labels, state, strict=False):
        if not isinstance(t, torch.Tensor):
            raise TensorFormatError(f"{where}: {label}: expected a tensor, got {type(t).__name__}")
    count = tensor_count(tree)
    if count != len(state):
        raise TensorFormatError(f"{where}: the spec's state names {count} tensor(s), {len(state)} came")
    devices = {t.device for t in state}
    if one_device and len(devices) > 1:
        by_device = ", ".join(f"{label} on {t.device}" for label, t in zip(labels, state, strict=True))
        raise TensorFormatError(f"{where}: expected every buffer on one device, got {by_device}")
    weight_dims = get_op(kernel.op).weight_dims
    missing = [d for d in weight_dims if not isinstance(dims.get(d), int)]
    if missing:
        raise TensorFormatError(f"{where}: the spec's dims {json.dumps(dict(dims))} lack {missing}")
    state = [laid_out(t) for t in state]
    prepared = unflatten(tree, state, allowed=allowed, where=f"{where}: the spec's state tree")
    # The tree must be the one flatten writes for this object: each tensor referenced, in
    # the order first met, shared only where prepare shared it. A tree whose indices were
    # moved (one buffer read for another of the same shape) is not.
    canonical = flatten(prepared, where=where)
    given = tree if isinstance(tree, str) else json.dumps(tree, sort_keys=True, separators=(",", ":"))
    if canonical.tree != given or len(canonical.tensors) != len(state) or \
            any(a is not b for a, b in zip(canonical.tensors, state, strict=True)):
        raise TensorFormatError(f"{where}: the spec's state tree refers to its tensors otherwise than prepare does "
                                "(a tensor index moved, one left unused or one read twice)")
    check_prepared(kernel, {d: dims[d] for d in weight_dims}, prepared, where=where,
                   names={id(t): label for t, label in zip(state, labels, strict=True)})
    return prepared
