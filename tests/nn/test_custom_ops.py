"""Kernel calls as custom ops: the prepared-state flattening, and every kernel that runs
on the CPU checked through ``torch.library.opcheck`` (schema, fake implementation against
the real one) and bit for bit against its direct call."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest
import torch

from quantcore.custom_ops import KernelOp, flatten, unflatten
from quantcore.custom_ops.state import builder, resolve_class
from quantcore.errors import PluginError, TensorFormatError
from quantcore.formats.gptq import GPTQ
from quantcore.ops.harness import get_harness
from quantcore.probe import probe

from ..interpreting import INTERPRETER


@dataclass(frozen=True)
class Inner:
    a: torch.Tensor
    scale: float


class Pair(NamedTuple):
    left: torch.Tensor
    right: torch.Tensor | None


@dataclass(kw_only=True)
class Outer:
    inners: tuple[Inner, ...]
    pair: Pair
    by_dtype: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor | None]] = field(default_factory=dict)
    keyed: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    fmt: GPTQ = field(default_factory=GPTQ)
    flags: list[Any] = field(default_factory=list)


class Opaque:
    """A class outside the generic rules, flattened through the protocol."""

    def __init__(self, table: torch.Tensor, label: str) -> None:
        self.table, self.label = table, label

    def __quantcore_flatten__(self) -> dict[str, Any]:
        return {"table": self.table, "label": self.label}

    @classmethod
    def __quantcore_unflatten__(cls, value: dict[str, Any]) -> Opaque:
        return cls(value["table"], value["label"])


def test_flatten_round_trips_nested_state_and_shares_repeated_tensors() -> None:
    gen = torch.Generator().manual_seed(1)
    shared = torch.randn(3, generator=gen)
    obj = Outer(
        inners=(Inner(shared, math.inf), Inner(torch.randn(2, generator=gen), -0.0)),
        pair=Pair(shared, None),
        by_dtype={torch.bfloat16: (torch.randn(4, generator=gen), None)},
        keyed={("x", 2): torch.arange(5)},
        fmt=GPTQ(bits=8, pack_dtype=torch.int16),
        flags=[True, 3, "s", None, math.nan, Opaque(torch.ones(2), "lut")],
    )
    flat = flatten(obj)
    assert len(flat.tensors) == 5  # `shared` once, though reached twice
    assert flat.names[0] == "inners_0_a" and "by_dtype_bfloat16_0" in flat.names
    moved = [t * 2 for t in flat.tensors]
    back = unflatten(flat.tree, moved, allowed=("quantcore", __name__.split(".")[0]))
    assert type(back) is Outer and back.fmt == obj.fmt
    assert back.inners[0].a is back.pair.left is moved[0]
    assert back.inners[0].scale == math.inf and math.copysign(1, back.inners[1].scale) < 0
    assert torch.equal(back.by_dtype[torch.bfloat16][0], obj.by_dtype[torch.bfloat16][0] * 2)
    assert back.by_dtype[torch.bfloat16][1] is None and back.pair.right is None
    assert torch.equal(back.keyed[("x", 2)], torch.arange(5) * 2)
    assert back.flags[:4] == [True, 3, "s", None] and math.isnan(back.flags[4])
    assert isinstance(back.flags[5], Opaque) and back.flags[5].label == "lut"


def test_a_builder_reads_the_tree_once_and_builds_on_each_call_s_tensors() -> None:
    """What a call through an op repeats: the tree read once, then per call an object on
    that call's tensors (none kept from an earlier call, no container shared between calls)."""
    obj = Outer(inners=(Inner(torch.ones(2), 1.5),), pair=Pair(torch.zeros(3), None), flags=[1, "a"])
    flat = flatten(obj)
    build = builder(flat.tree, allowed=("quantcore", __name__.split(".")[0]))
    first, second = [t + 1 for t in flat.tensors], [t + 2 for t in flat.tensors]
    a, b = build(first), build(second)
    assert a.inners[0].a is first[0] and b.inners[0].a is second[0] and b.pair.left is second[1]
    assert a.flags == b.flags == [1, "a"] and a.flags is not b.flags
    assert type(a) is Outer and a.inners[0].scale == 1.5
    with pytest.raises(TensorFormatError, match="tensor index out of range"):
        build(first[:1])


def test_flatten_names_what_it_cannot_take_and_unflatten_imports_only_allowed_packages() -> None:
    @dataclass
    class Holder:
        weight: torch.Tensor
        handle: object

    with pytest.raises(PluginError, match=r"prepared\.handle: a builtins\.object cannot be flattened"):
        flatten(Holder(torch.zeros(1), object()))
    with pytest.raises(PluginError, match="expected one of the packages"):
        resolve_class("os:system")
    with pytest.raises(PluginError, match="cannot be found"):
        resolve_class("quantcore.formats:NoSuchFormat")


def _smallest_case_per_kernel(registry: Any) -> list[tuple[Any, str]]:
    """For every kernel that runs on this CPU (Triton's under the interpreter), the
    smallest ``ci`` conformance case it takes."""
    caps = probe("cpu")
    best: dict[tuple[str, str, str], Any] = {}
    for case in registry.conformance_cases():
        if case.profile != "ci":
            continue
        for entry in registry.kernels(case.format.name, case.op):
            key = (case.format.name, case.op, entry.cls.name)
            if entry.cls.check_device(caps) is not None or not entry.cls.supports(case.problem):
                continue
            if key not in best or _size(case) < _size(best[key]):
                best[key] = case
    return [(case, key[2]) for key, case in sorted(best.items())]


def _size(case: Any) -> tuple[int, str]:
    return math.prod(v for _, v in case.dims), case.id


def test_every_cpu_kernel_is_an_op_with_a_correct_fake(registry: Any) -> None:
    pairs = _smallest_case_per_kernel(registry)
    kernels = {name for _, name in pairs}
    # Every built-in backend that runs here, so a kernel cannot silently drop out.
    expected = {"aten_cpu", "awq_cpu", "torch_fallback", "turboquant_torch", "trtllm_moe_torch", "svdquant_torch"}
    if INTERPRETER:
        expected |= {"turboquant_triton", "trtllm_moe_triton", "triton_nvfp4", "triton_ascend_int4"}
    assert expected <= kernels, expected - kernels
    done = 0
    for case, name in pairs:
        harness = get_harness(case.op)
        kernel = registry.kernel(case.format.name, case.op, name).cls(case.format, torch.device("cpu"))
        weights = harness.weights(case)
        inputs = harness.inputs(case, weights)
        prepared = harness.prepare(kernel, case, weights)
        if isinstance(prepared, tuple):  # a MoE FFN case prepares two weights: take the first GEMM
            prepared = prepared[0]
        op = KernelOp(kernel, prepared, dict(case.dims))
        if case.op == "linear":
            args = (inputs.x, list(op.state.tensors), op.spec)
            target = torch.ops.quantcore.linear.default
            direct = kernel(inputs.x, prepared)
        elif case.op == "moe":
            args = (inputs.x, inputs.topk_ids, inputs.topk_weights, list(op.state.tensors), op.spec)
            target = torch.ops.quantcore.moe.default
            direct = kernel(inputs.x, inputs.topk_ids, prepared, topk_weights=inputs.topk_weights)
        else:
            args = (inputs.x, list(op.state.tensors), op.spec)
            target = torch.ops.quantcore.act_quant_lora.default
            direct = kernel(inputs.x, prepared)
        report = torch.library.opcheck(target, args, test_utils=("test_schema", "test_faketensor"))
        assert set(report.values()) == {"SUCCESS"}, (case.cell_id(name), report)
        through_op = target(*args)
        for got, want in zip(_tuple(through_op), _tuple(direct), strict=True):
            assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8)), case.cell_id(name)
        done += 1
    assert done == len(pairs)


def _tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, tuple) else (out,)


def test_a_gradient_through_the_op_is_refused_not_dropped() -> None:
    """The ops have no gradient: a backward through one raises, whatever kernel ran (a
    gradient silently missing would train a wrong model); the forward still runs."""
    import quantcore
    from quantcore.custom_ops import call_op

    model = torch.nn.Sequential(torch.nn.Linear(128, 64, bias=False))
    quantcore.quantize_(model, GPTQ(bits=4, group_size=128))
    layer = model[0]
    x = torch.randn(3, 128, requires_grad=True)
    y = call_op(layer.op.name, layer._spec, layer.state_tensors(), x)
    assert y.shape == (3, 64) and y.requires_grad
    with pytest.raises(RuntimeError, match=r"not implemented|no autograd"):
        y.sum().backward()
