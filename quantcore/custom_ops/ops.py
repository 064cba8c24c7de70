"""Every kernel call as a ``torch.library`` custom op: one op per op kind, any kernel.

Three ops live in the ``quantcore`` namespace, one per op kind (:mod:`quantcore.ops`)::

    quantcore::linear(Tensor x, Tensor[] state, str spec) -> Tensor
    quantcore::moe(Tensor x, Tensor topk_ids, Tensor? topk_weights, Tensor[] state, str spec) -> Tensor
    quantcore::act_quant_lora(Tensor x, Tensor[] state, str spec) -> (Tensor, Tensor, Tensor)

``state`` is a kernel's prepared state flattened (:mod:`.state`); ``spec`` is a JSON
string naming the kernel (format, op, name), the format's parameters, the problem dims
the output depends on, and the tree that rebuilds the prepared state from ``state``. The
real implementation rebuilds the kernel and its prepared state from ``spec`` (cached per
spec and device) and calls it; the fake implementation is the op's output rule, which
needs only the inputs' shapes and the spec's dims. So a kernel becomes traceable by
``torch.compile`` (no graph break), capturable in CUDA graphs and exportable the day it
registers, with no code of its own, as long as its prepared state flattens.

Because ``spec`` carries everything by name, an exported program that calls these ops
runs in another process too, once ``quantcore.custom_ops`` is imported there.

Eager calls from quantcore's modules skip the dispatcher (:func:`traced` decides): a
custom op costs several microseconds of host time per call, as much as a decode GEMV on
a GPU. They run the same code the op runs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import KernelInputError, PluginError
from ..formats.base import Format
from ..kernel import Kernel
from .state import FlattenedState, class_path, flatten, unflatten

__all__ = ["OUTPUT_RULES", "KernelOp", "Resolved", "call_op", "make_spec", "resolve", "traced"]

SPEC_VERSION = 1
_KERNEL_CLASSES: dict[str, type[Kernel]] = {}


def make_spec(kernel: Kernel, state: FlattenedState, dims: Mapping[str, int]) -> str:
    """The ``spec`` argument of a call of ``kernel`` on ``state`` for a problem of ``dims``."""
    cls = type(kernel)
    _KERNEL_CLASSES[class_path(cls)] = cls
    fmt = flatten(kernel.fmt, where=f"{kernel.name}.fmt")
    if fmt.tensors:
        raise PluginError(f"format {kernel.fmt.slug}: a format's parameters cannot hold tensors")
    spec = {
        "v": SPEC_VERSION,
        "kernel": {"format": cls.format, "op": cls.op, "name": cls.name, "cls": class_path(cls)},
        "fmt": json.loads(fmt.tree),
        "dims": {k: int(v) for k, v in sorted(dims.items())},
        "state": json.loads(state.tree),
    }
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


@dataclass
class Resolved:
    """A spec, read: the kernel class, the format, the dims, the prepared-state tree."""

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
    cls = _KERNEL_CLASSES.get(ref["cls"])
    if cls is None:
        from ..registry import default_registry

        cls = default_registry().kernel(ref["format"], ref["op"], ref["name"]).cls
    allowed = tuple(dict.fromkeys(("quantcore", cls.__module__.split(".")[0])))
    fmt = unflatten(data["fmt"], (), allowed=allowed)
    if not isinstance(fmt, Format):
        raise KernelInputError(f"spec: 'fmt' describes a {type(fmt).__name__}, not a Format")
    return Resolved(cls, fmt, dict(data["dims"]), data["state"], allowed)


def _bind(spec: str, state: Sequence[torch.Tensor], device: torch.device) -> tuple[Kernel, Any]:
    r = resolve(spec)
    return r.kernel(device), r.prepared(state)


# --- the ops --------------------------------------------------------------------------------


@torch.library.custom_op("quantcore::linear", mutates_args=())
def linear(x: torch.Tensor, state: list[torch.Tensor], spec: str) -> torch.Tensor:
    kernel, prepared = _bind(spec, state, x.device)
    return kernel(x, prepared)  # type: ignore[operator, no-any-return]


@torch.library.custom_op("quantcore::moe", mutates_args=())
def moe(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor | None, state: list[torch.Tensor], spec: str
) -> torch.Tensor:
    kernel, prepared = _bind(spec, state, x.device)
    return kernel(x, topk_ids, prepared, topk_weights=topk_weights)  # type: ignore[operator, no-any-return]


@torch.library.custom_op("quantcore::act_quant_lora", mutates_args=())
def act_quant_lora(
    x: torch.Tensor, state: list[torch.Tensor], spec: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kernel, prepared = _bind(spec, state, x.device)
    out = kernel(x, prepared)  # type: ignore[operator]
    return out[0], out[1], out[2]


# --- output rules: the fake implementations ---------------------------------------------------


def _linear_out(x: torch.Tensor, state: list[torch.Tensor], spec: str) -> torch.Tensor:
    n = resolve(spec).dims["N"]
    return x.new_empty((*x.shape[:-1], n))


def _moe_out(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor | None, state: list[torch.Tensor], spec: str
) -> torch.Tensor:
    n = resolve(spec).dims["N"]
    t, topk = topk_ids.shape
    return x.new_empty((t, n) if topk_weights is not None else (t, topk, n))


def _act_quant_lora_out(
    x: torch.Tensor, state: list[torch.Tensor], spec: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r = resolve(spec)
    fmt: Any = r.fmt
    m_pad = fmt.padded_rows(x.shape[0])
    n, rank = r.dims["N"], r.dims["R"]
    return (
        x.new_empty((m_pad, n // 2), dtype=torch.uint8),
        x.new_empty((n // fmt.block, m_pad), dtype=fmt.scale_dtype),
        x.new_empty((m_pad, rank), dtype=torch.float32),
    )


linear.register_fake(_linear_out)
moe.register_fake(_moe_out)
act_quant_lora.register_fake(_act_quant_lora_out)

#: Op kind → (the custom op, its output rule).
OUTPUT_RULES: dict[str, tuple[Any, Callable[..., Any]]] = {
    "linear": (linear, _linear_out),
    "moe": (moe, _moe_out),
    "act_quant_lora": (act_quant_lora, _act_quant_lora_out),
}


# --- calling -----------------------------------------------------------------------------------


def traced(x: torch.Tensor) -> bool:
    """True when a call must go through the op: under ``torch.compile`` / ``torch.export``,
    or on a fake, meta or other tensor subclass (shape inference, tracing)."""
    return torch.compiler.is_compiling() or type(x) is not torch.Tensor or x.is_meta


def call_op(op: str, spec: str, state: Sequence[torch.Tensor], *inputs: Any, **options: Any) -> Any:
    """Run the ``op`` kind through its custom op: ``call_op("linear", spec, state, x)``,
    ``call_op("moe", spec, state, x, topk_ids, topk_weights=w)``."""
    if op == "linear":
        return torch.ops.quantcore.linear(inputs[0], list(state), spec)
    if op == "moe":
        return torch.ops.quantcore.moe(inputs[0], inputs[1], options.get("topk_weights"), list(state), spec)
    if op == "act_quant_lora":
        from ..ops.act_quant_lora import ActQuantLoraOutput

        return ActQuantLoraOutput(*torch.ops.quantcore.act_quant_lora(inputs[0], list(state), spec))
    raise PluginError(f"op: no custom op for {op!r}; expected one of {sorted(OUTPUT_RULES)}")


class KernelOp:
    """A prepared kernel as a traceable callable, for engines with modules of their own::

        op = KernelOp(kernel, kernel.prepare(tensors), {"K": 4096, "N": 4096})
        y = op(x)        # torch.ops.quantcore.linear under torch.compile, the kernel eagerly

    ``dims`` are the problem dims the op's output rule reads (N for a linear or a MoE,
    N and R for ``act_quant_lora``)."""

    def __init__(self, kernel: Kernel, prepared: Any, dims: Mapping[str, int]) -> None:
        self.kernel, self.prepared = kernel, prepared
        self.state = flatten(prepared, where=f"{kernel.name}.prepare()")
        self.spec = make_spec(kernel, self.state, dims)

    def __call__(self, *inputs: Any, **options: Any) -> Any:
        if traced(inputs[0]):
            return call_op(self.kernel.op, self.spec, self.state.tensors, *inputs, **options)
        return self.kernel(*inputs, self.prepared, **options)  # type: ignore[operator]
