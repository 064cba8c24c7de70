"""Every kernel call as a ``torch.library`` custom op: one op per op kind, any kernel.

Each op kind's declaration (:class:`quantcore.ops.Op`) defines its op in the
``quantcore`` namespace, with the declared inputs, then the prepared state and the spec::

    quantcore::linear(Tensor x, Tensor[] state, str spec) -> Tensor
    quantcore::moe(Tensor x, Tensor topk_ids, Tensor? topk_weights, Tensor[] state, str spec) -> Tensor
    quantcore::act_quant_lora(Tensor x, Tensor[] state, str spec) -> (Tensor, Tensor, Tensor)

``state`` is a kernel's prepared state flattened (:mod:`.state`); ``spec`` names the
kernel and how to rebuild the prepared state (:mod:`.spec`). The real implementation
rebuilds both from ``spec`` and calls the kernel; the fake implementation is the
declaration's output rule, which needs only the inputs' shapes and the spec's format and
dims. So a kernel becomes traceable by ``torch.compile`` (no graph break), capturable in
CUDA graphs and exportable the day it registers, with no code of its own, as long as its
prepared state flattens.

Eager calls skip the dispatcher (:func:`traced` decides): a custom op costs several
microseconds of host time per call, as much as a decode GEMV on a GPU. They run the same
code the op runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import InvalidArgumentError, PluginError
from ..kernel import Kernel
from ..ops import Op, get_op, op_kinds
from ..tensors import traced
from .spec import make_spec, resolve
from .state import flatten

__all__ = ["KernelOp", "call_op", "traced"]


#: The ``quantcore`` op namespace. The ops are defined on a plain ``torch.library.Library``
#: rather than through ``torch.library.custom_op``, whose Python wrappers (autograd
#: dispatch, a dynamo-disabled frame) cost a compiled call more host time than the rest of
#: the op's path; these ops have no gradient (quantized weights are not trained here).
_LIBRARY = torch.library.Library("quantcore", "DEF")


def _define(op: Op) -> Any:
    """``quantcore::<op.name>``: the op, with the declaration's output rule as its fake."""
    n_in, n_opt = len(op.inputs), len(op.options)

    def split(args: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any], list[torch.Tensor], str]:
        return args[:n_in], dict(zip(op.options, args[n_in:n_in + n_opt], strict=True)), args[-2], args[-1]

    def run(*args: Any) -> Any:
        inputs, options, state, spec = split(args)
        r = resolve(spec)
        out = r.kernel(inputs[0].device)(*inputs, r.prepared(state), **options)
        return tuple(out) if op.result is not None else out

    def output_rule(*args: Any) -> Any:
        inputs, options, _, spec = split(args)
        r = resolve(spec)
        return op.output(r.fmt, r.dims, *inputs, **options)

    _LIBRARY.define(op.name + op.schema)
    _LIBRARY.impl(op.name, run, "CompositeExplicitAutograd")
    torch.library.register_fake(f"quantcore::{op.name}", output_rule, lib=_LIBRARY)
    return getattr(torch.ops.quantcore, op.name)


#: Op kind → its custom op (``torch.ops.quantcore.<name>``).
_CUSTOM_OPS: dict[str, Any] = {name: _define(op) for name, op in op_kinds().items()}


def call_op(op: str, spec: str, state: Sequence[torch.Tensor], *inputs: Any, **options: Any) -> Any:
    """Run the ``op`` kind through its custom op: ``call_op("linear", spec, state, x)``,
    ``call_op("moe", spec, state, x, topk_ids, topk_weights=w)``."""
    custom = _CUSTOM_OPS.get(op)
    if custom is None:
        raise PluginError(f"op: no custom op for {op!r}; expected one of {sorted(_CUSTOM_OPS)}")
    decl = get_op(op)
    unknown = set(options) - set(decl.options)
    if unknown:
        raise InvalidArgumentError(f"{op}: unknown option(s) {sorted(unknown)}; it takes {list(decl.options)}")
    out = custom(*inputs, *(options.get(n) for n in decl.options), list(state), spec)
    return decl.result(*out) if decl.result is not None else out


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
        return self.kernel(*inputs, self.prepared, **options)
