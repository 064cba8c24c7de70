"""Prepared state handed back: a module's state dict, corrupted, loaded into a meta
skeleton (``assign=True``) or into a bound module, then called.

Every kernel the fuzz device runs is the layout under test (the module is bound with
``prefer=`` it). A corruption is one of: a buffer truncated, emptied, a row longer,
flattened, transposed, of another dtype, on ``meta``, missing, not a tensor, an unknown
buffer added; the ``_extra_state`` not a dict, of another version, its spec not a string
or not JSON, an integer of its state tree or dims changed, a tensor index changed, a
format parameter changed, another kernel or an unknown one named, a class path outside
the allowed packages, its buffer names dropped, swapped, duplicated or renamed to an
attribute of the module. And a few that change nothing a kernel reads (the same values
at a storage offset or non-contiguous), which must load.

Each case is refused with a quantcore error naming the buffer, the spec or the field,
or it loads and the call computes the golden output of the original weight.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from quantcore.errors import NoKernelError, QuantCoreError
from quantcore.nn.quant_module import QuantModule
from quantcore.ops import get_op
from quantcore.registry import KernelEntry

from .fuzz.mutations import noncontiguous, offset_view
from .fuzz.op_oracles import oracle_for
from .fuzz.oracles import place
from .fuzz.profiles import examples
from .fuzz.seeds import DEVICE, registry, runnable_kernels, seed_tensors, seeds_for
from .fuzz.tally import attempt

KERNELS = [e for e in runnable_kernels() if seeds_for(e.cls.format, e.cls.op) and oracle_for(e.cls.op)]
INTERPRETED = [e for e in KERNELS if "triton" in e.cls.requires.packages and DEVICE == "cpu"]
FAST = [e for e in KERNELS if e not in INTERPRETED]
#: Names a refusal may give besides the buffers, the format's fields and the dims.
NAMES = ("_extra_state", "spec", "names", "version", "prepared", "dims", "fmt", "state", "kernel", "device")


def _id(e: KernelEntry) -> str:
    return f"{e.cls.format}/{e.cls.name}"


class ModuleAsKernel:
    """The oracle calls ``kernel(*inputs, prepared, **options)``: a module takes the same
    without the prepared state."""

    def __init__(self, module: QuantModule) -> None:
        self.module = module

    def __call__(self, *args: Any, **options: Any) -> Any:
        return self.module(*args[:-1], **options)


def _bound(entry: KernelEntry, data: st.DataObject) -> tuple[Any, Mapping[str, torch.Tensor], QuantModule]:
    cases = [c for c in seeds_for(entry.cls.format, entry.cls.op) if entry.cls.supports(c.problem)]
    assume(cases)
    case = data.draw(st.sampled_from(cases), label="seed")
    tensors = seed_tensors(case)
    try:
        module = QuantModule(case.format, tensors, device=DEVICE, dtype=case.act_dtype, prefer=entry.cls.name)
    except (QuantCoreError, NoKernelError):
        assume(False)
    assume(module.kernel is not None and module.kernel.name == entry.cls.name)
    return case, tensors, module


# --- corruptions ------------------------------------------------------------------------------


def _buffer(sd: dict[str, Any], data: st.DataObject) -> str:
    return data.draw(st.sampled_from(sorted(k for k in sd if k != "_extra_state")), label="buffer")


def _reshaped(t: torch.Tensor, how: str) -> torch.Tensor:
    if how == "truncated":
        return t[:-1] if t.dim() else t.reshape(1)
    if how == "emptied":
        return t[:0] if t.dim() else t.reshape(1)[:0]
    if how == "a row longer":
        return torch.cat([t, t[:1]]) if t.dim() else t.reshape(1).repeat(2)
    if how == "flattened":
        return t.reshape(-1) if t.dim() != 1 else t.reshape(1, -1)
    if how == "transposed":
        return t.mT.contiguous() if t.dim() >= 2 and t.shape[-1] != t.shape[-2] else t.reshape(-1, 1)
    raise AssertionError(how)


def _tree_ints(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every integer in a JSON tree (tensor indices included)."""
    if isinstance(node, bool):
        return []
    if isinstance(node, int):
        return [path]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _tree_ints(v, (*path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _tree_ints(v, (*path, i))]
    return []


def _set(node: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _other_kernel(kernel: str, fmt: str, op: str, data: st.DataObject) -> str:
    others = [*sorted({e.cls.name for e in registry().kernels(fmt, op)} - {kernel}), "no_such_kernel"]
    return data.draw(st.sampled_from(others), label="other kernel")


def corrupt(sd: dict[str, Any], data: st.DataObject) -> tuple[str, bool]:
    """Corrupt the state dict in place; (what was done, whether the values a kernel reads
    are unchanged — such a state must load and compute the same)."""
    extra = sd["_extra_state"]
    kind = data.draw(st.sampled_from((
        "truncated", "emptied", "a row longer", "flattened", "transposed", "dtype", "meta", "missing", "not a tensor",
        "unknown buffer", "offset", "non-contiguous", "extra not a dict", "version", "spec type", "spec not JSON",
        "tree int", "dims", "fmt param", "other kernel", "class path", "names",
    )), label="corruption")
    if kind in ("truncated", "emptied", "a row longer", "flattened", "transposed"):
        name = _buffer(sd, data)
        sd[name] = _reshaped(sd[name], kind)
        return f"{name} {kind}", False
    if kind == "dtype":
        name = _buffer(sd, data)
        dtype = data.draw(st.sampled_from((torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
                                           torch.bfloat16, torch.float32, torch.float64, torch.bool)), label="dtype")
        same = sd[name].dtype == dtype
        sd[name] = sd[name].to(dtype)
        return f"{name} as {dtype}", same
    if kind == "meta":
        name = _buffer(sd, data)
        sd[name] = sd[name].to("meta")
        return f"{name} on meta", False
    if kind == "missing":
        name = _buffer(sd, data)
        del sd[name]
        return f"{name} missing", False
    if kind == "not a tensor":
        name = _buffer(sd, data)
        sd[name] = data.draw(st.sampled_from((None, 5, "x", [1, 2])), label="value")
        return f"{name} = {sd[name]!r}", False
    if kind == "unknown buffer":
        sd["stray"] = torch.zeros(3)
        return "an unknown buffer", True
    if kind in ("offset", "non-contiguous"):
        name = _buffer(sd, data)
        sd[name] = (offset_view if kind == "offset" else noncontiguous)(sd[name])
        return f"{name} {kind}", True
    if kind == "extra not a dict":
        sd["_extra_state"] = data.draw(st.sampled_from((None, [], "spec", 3)), label="extra")
        return f"_extra_state = {sd['_extra_state']!r}", False
    extra = dict(extra)
    sd["_extra_state"] = extra
    if kind == "version":
        extra["version"] = data.draw(st.sampled_from((0, 2, "1", None)), label="version")
        return f"version {extra['version']!r}", False
    if kind == "spec type":
        extra["spec"] = data.draw(st.sampled_from((None, 5, {}, ["x"])), label="spec")
        return f"spec = {extra['spec']!r}", False
    if kind == "spec not JSON":
        extra["spec"] = data.draw(st.sampled_from(("{", "[]", "null", '{"v": 1}', extra["spec"][:-3])), label="spec")
        return f"spec {extra['spec'][:20]!r}", False
    spec = json.loads(extra["spec"])
    if kind == "tree int":
        paths = _tree_ints(spec["state"])
        assume(paths)
        path = data.draw(st.sampled_from(paths), label="tree int")
        node = spec["state"]
        for key in path:
            node = node[key]
        new = data.draw(st.sampled_from((0, -1, 1, node + 1, node - 1, node * 2, 2**40)), label="value")
        _set(spec["state"], path, new)
        same = new == node
        what = f"state{list(path)} {node} -> {new}"
    elif kind == "dims":
        dim = data.draw(st.sampled_from(sorted(spec["dims"])), label="dim")
        old = spec["dims"][dim]
        spec["dims"][dim] = data.draw(st.sampled_from((0, -1, old + 1, old * 2, "x", None)), label="value")
        same, what = spec["dims"][dim] == old, f"dims {dim} {old} -> {spec['dims'][dim]!r}"
    elif kind == "fmt param":
        fields = sorted(spec["fmt"]["f"])
        assume(fields)
        field = data.draw(st.sampled_from(fields), label="field")
        old = spec["fmt"]["f"][field]
        spec["fmt"]["f"][field] = data.draw(st.sampled_from((0, 3, 8, -1, True, "x", None)), label="value")
        same, what = spec["fmt"]["f"][field] == old, f"fmt {field} {old!r} -> {spec['fmt']['f'][field]!r}"
    elif kind == "other kernel":
        ref = spec["kernel"]
        ref["name"] = _other_kernel(ref["name"], ref["format"], ref["op"], data)
        same, what = False, f"kernel {ref['name']}"
    elif kind == "class path":
        paths = [p for p in _tree_paths(spec["state"]) if p]
        assume(paths)
        path = data.draw(st.sampled_from(paths), label="class")
        _set(spec["state"], path, data.draw(st.sampled_from((
            "os:system", "quantcore.formats.gptq:GPTQ", "quantcore.schema:TensorSpec", "builtins:dict")), label="to"))
        same, what = False, f"class at {list(path)}"
    else:  # names
        names = list(extra["names"])
        how = data.draw(st.sampled_from(("drop", "swap", "duplicate", "rename")), label="names")
        if how == "drop" or (len(names) < 2 and how in ("swap", "duplicate")):
            names = names[1:]
        elif how == "swap":
            names[0], names[1] = names[1], names[0]
        elif how == "duplicate":
            names[1] = names[0]
        else:
            names[0] = data.draw(st.sampled_from(("training", "forward", "a.b", "source_x", "", "kernel")), label="to")
        extra["names"] = names
        return f"names {how}: {names}", False
    extra["spec"] = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return what, same


def _tree_paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every class name in a JSON tree."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("dc", "nt", "obj") and isinstance(v, str):
                out.append((*path, k))
            else:
                out += _tree_paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _tree_paths(v, (*path, i))
    return out


# --- the test ---------------------------------------------------------------------------------


def run_example(entry: KernelEntry, data: st.DataObject) -> None:
    case, tensors, module = _bound(entry, data)
    oracle = oracle_for(case.op)
    assert oracle is not None
    sd = copy.copy(module.state_dict())
    what, same = corrupt(sd, data)
    assign = data.draw(st.booleans(), label="assign")
    dims = dict(module.dims)
    inputs = place(oracle.nominal(data, case.format.validate(tensors), case.act_dtype), DEVICE)
    fields = [f.name for f in dataclasses.fields(case.format)]  # type: ignore[arg-type]
    names = [*(k for k in module.state_dict() if k != "_extra_state"), *NAMES, *fields, *dims, *oracle.arg_names,
             "stray"]

    def load_and_call() -> Any:
        if assign:
            target = QuantModule(case.format, dims=dims, device="meta", dtype=case.act_dtype)
        else:
            target = QuantModule(case.format, tensors, device=DEVICE, dtype=case.act_dtype, prefer=entry.cls.name)
        target.load_state_dict(sd, strict=False, assign=assign)
        return oracle.call(ModuleAsKernel(target), None, inputs)

    def judge(out: Any) -> str | None:
        problem = oracle.judge(out, case.format, tensors, inputs)
        return f"loaded {'the' if same else 'a corrupted'} state ({what}), then: {problem}" if problem else None

    attempt(f"state:{entry.cls.name}", load_and_call, names=names, judge=judge,
            context=lambda: f"{case.id} {entry.cls.name}: {what} (assign={assign})")


@pytest.mark.parametrize("entry", FAST, ids=_id)
@settings(max_examples=examples("kernel"))
@given(data=st.data())
def test_state_dict_corruption(entry: KernelEntry, data: st.DataObject) -> None:
    run_example(entry, data)


@pytest.mark.parametrize("entry", INTERPRETED, ids=_id)
@settings(max_examples=examples("slow"))
@given(data=st.data())
def test_state_dict_corruption_interpreted(entry: KernelEntry, data: st.DataObject) -> None:
    run_example(entry, data)


def test_every_kernel_state_is_checked_against_its_schema() -> None:
    """What each kernel's prepare makes, for every seed and activation dtype, matches the
    schema a state handed back is held to (a schema that refused its own kernel's state
    would make every state dict unloadable)."""
    from quantcore.custom_ops.schema import check_prepared

    checked = 0
    for entry in KERNELS:
        for case in seeds_for(entry.cls.format, entry.cls.op):
            kernel = entry.cls(case.format, torch.device(DEVICE))
            dims = {d: case.problem[d] for d in get_op(case.op).weight_dims}
            for dtype in (None, torch.bfloat16, torch.float16, torch.float32):
                try:
                    prepared = kernel.prepare(seed_tensors(case), dtype=dtype)
                except QuantCoreError:
                    continue
                check_prepared(kernel, dims, prepared, where=f"{entry.cls.name} {case.id}")
                checked += 1
    assert checked > 50
