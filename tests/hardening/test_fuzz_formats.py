"""Fuzzed bad inputs for every registered format: its parameters (the constructor and
``from_params``), its validator, its golden dequantizer and its golden quantizer.

Each case is refused with a quantcore error naming the tensor or parameter, or handled
correctly; see ``fuzz/tally.py`` for the classification and ``fuzz/mutations.py`` for
what is generated.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore.errors import QuantCoreError
from quantcore.formats.base import Format
from quantcore.ops import get_op

from .fuzz.mutations import LAYOUTS, mutate_tensors, reparameterize
from .fuzz.op_oracles import oracle_for
from .fuzz.oracles import OpOracle
from .fuzz.profiles import examples
from .fuzz.seeds import format_classes, seed_cases, seed_tensors, seeds_for
from .fuzz.tally import attempt

FORMAT_NAMES = sorted(format_classes())
SEEDED = sorted({c.format.name for c in seed_cases()})


def _writer(name: str) -> OpOracle | None:
    """The oracle of the op whose outputs are this format's stored tensors, if it is one."""
    oracle = oracle_for(format_classes()[name].op)
    return oracle if oracle is not None and oracle.writes_format else None


#: Formats whose stored tensors an op writes (``dequantize`` reads the op's outputs).
OUTPUT_FORMATS = [n for n in SEEDED if _writer(n)]


def test_every_format_has_seeds() -> None:
    """A format without conformance cases would be fuzzed only through its parameters."""
    assert set(FORMAT_NAMES) == set(SEEDED), f"formats without conformance cases: {set(FORMAT_NAMES) - set(SEEDED)}"


def _fields(cls: type[Format]) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def well_typed(fmt: Format) -> str | None:
    """An accepted parameter must have its declared type (a bool field holds a bool, not
    the string "false", which is truthy)."""
    hints = _hints(type(fmt))
    for f in _fields(type(fmt)):
        value, hint = getattr(fmt, f.name), hints.get(f.name)
        origin = typing.get_origin(hint)
        if hint is bool and not isinstance(value, bool):
            return f"{f.name}={value!r} accepted for a bool parameter"
        if hint is int and (not isinstance(value, int) or isinstance(value, bool)):
            return f"{f.name}={value!r} accepted for an int parameter"
        if hint is torch.dtype and not isinstance(value, torch.dtype):
            return f"{f.name}={value!r} accepted for a dtype parameter"
        if hint is str and not isinstance(value, str):
            return f"{f.name}={value!r} accepted for a str parameter"
        if origin is typing.Literal and value not in typing.get_args(hint):
            return f"{f.name}={value!r} accepted for a parameter taking {typing.get_args(hint)}"
    return None


def usable(fmt: Any, cls: type[Format]) -> str | None:
    if not isinstance(fmt, cls):
        return f"returned {type(fmt).__name__}"
    problem = well_typed(fmt)
    if problem:
        return problem
    if not isinstance(fmt.slug, str) or not fmt.slug:
        return f"slug {fmt.slug!r}"
    hash(fmt)
    again = cls.from_params(**fmt.params())
    if again != fmt:
        return f"from_params(**params()) gave {again!r}, not {fmt!r}"
    return None


PARAM_VALUES: tuple[Any, ...] = (
    -2**40, -2, -1, 0, 1, 2, 3, 4, 5, 7, 8, 16, 31, 32, 33, 64, 96, 100, 128, 256, 512, 2**31,
    True, False, 4.0, 0.5, float("nan"), None, "4", "x", "", "true", "false", "v1", "gemm",
    torch.int32, torch.int8, torch.float16, torch.bfloat16, torch.float32, torch.uint8, torch.float64,
    [4], (128,), {"bits": 4},
)
INTS = (-1, 0, 1, 2, 3, 4, 5, 8, 16, 32, 48, 64, 100, 128, 256, 512)
DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32, torch.uint8)


def typed_values(f: dataclasses.Field[Any], hint: Any) -> st.SearchStrategy[Any]:
    """Values of the field's own type, mostly plausible: the default, its neighbours."""
    default = [f.default] if f.default is not dataclasses.MISSING else []
    if hint is bool:
        return st.sampled_from([True, False])
    if hint is int:
        return st.sampled_from(default + list(INTS))
    if hint is torch.dtype:
        return st.sampled_from(default + list(DTYPES))
    if typing.get_origin(hint) is typing.Literal:
        return st.sampled_from(default + list(typing.get_args(hint)) + ["other"])
    return st.sampled_from(default) if default else st.sampled_from(PARAM_VALUES)


def param_values(f: dataclasses.Field[Any], hint: Any) -> st.SearchStrategy[Any]:
    typed = typed_values(f, hint)
    return st.one_of(typed, typed, st.sampled_from(PARAM_VALUES))


STRING_VALUES = ("4", "-1", "0", "128", "abc", "", "true", "false", "maybe", "float16", "torch.int32",
                 "bfloat16", "v1", "gptq_v2", "gemm", "int8", "nan", "1e3", " 4 ")


@pytest.mark.parametrize("name", FORMAT_NAMES)
@settings(max_examples=examples("fast"))
@given(data=st.data())
def test_format_parameters(name: str, data: st.DataObject) -> None:
    """``Format(**params)`` with generated parameters: bits out of range, group sizes of
    every sign and size, wrong types; accepted instances must be well-typed and survive
    ``from_params(**params())``."""
    cls = format_classes()[name]
    fields = _fields(cls)
    chosen = data.draw(st.lists(st.sampled_from(fields), max_size=len(fields), unique_by=lambda f: f.name), label="fields")
    hints = _hints(cls)
    params = {f.name: data.draw(param_values(f, hints.get(f.name)), label=f.name) for f in chosen}
    attempt(
        f"construct:{name}", lambda: cls(**params), names=[f.name for f in fields],
        judge=lambda fmt: usable(fmt, cls), context=f"{name}({params})",
    )


def _as_text(v: Any) -> Any:
    if isinstance(v, torch.dtype):
        return str(v).removeprefix("torch.")
    return str(v) if isinstance(v, (bool, int)) else v


@pytest.mark.parametrize("name", FORMAT_NAMES)
@settings(max_examples=examples("fast"))
@given(data=st.data())
def test_format_from_params(name: str, data: st.DataObject) -> None:
    """``from_params`` is how CLI strings and config files become a format: bad strings,
    unknown keys."""
    cls = format_classes()[name]
    fields = _fields(cls)
    chosen = data.draw(st.lists(st.sampled_from(fields), max_size=len(fields), unique_by=lambda f: f.name), label="fields")
    hints = _hints(cls)
    params: dict[str, Any] = {
        f.name: data.draw(st.one_of(param_values(f, hints.get(f.name)).map(_as_text), st.sampled_from(STRING_VALUES)), label=f.name)
        for f in chosen
    }
    if data.draw(st.booleans(), label="unknown key"):
        params["bogus_param"] = "1"
    attempt(
        f"from_params:{name}", lambda: cls.from_params(**params),
        names=[f.name for f in fields] + ["bogus_param"],
        judge=lambda fmt: usable(fmt, cls), context=f"{name}.from_params({params})",
    )


def names_for(fmt: Format, *tensor_sets: Mapping[str, Any]) -> list[str]:
    names = {n for t in tensor_sets for n in t} | {f.name for f in _fields(type(fmt))}
    return sorted(names | {"tensors", "weight", "in_features", "out_features", "K", "N", "E"})


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) if a.isfinite().all() else (
        a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())
    )


def valid_dims(fmt: Format) -> Any:
    """The judge of an accepted ``validate``: positive int dims (0 where the op allows)."""
    zero_ok = get_op(fmt.op).may_be_zero

    def judge(d: Any) -> str | None:
        ok = isinstance(d, dict) and all(
            isinstance(v, int) and (v > 0 or (v == 0 and k in zero_ok)) for k, v in d.items())
        return None if ok else f"dims {d!r}"

    return judge


def positive_sizes(sizes: Any) -> str | None:
    ok = isinstance(sizes, tuple) and all(isinstance(v, int) and v > 0 for v in sizes)
    return None if ok else f"sizes {sizes!r}"


def check_dequantize(
    fmt: Format, validate: Any, judge_valid: Any, tensors: Mapping[str, Any], original: Mapping[str, Any],
    done: list[str], name: str, names: list[str], context: Any,
) -> None:
    """``validate`` (the format's check of what ``dequantize`` reads) and ``dequantize``
    on the same tensors: they agree (dequantize refuses whatever validate refuses), and a
    layout that keeps the values (non-contiguous, offset) dequantizes bit for bit as the
    original does."""
    valid, dims = attempt(f"validate:{name}", lambda: validate(tensors), names=names, context=context, judge=judge_valid)
    sizes = list(dims.values()) if isinstance(dims, dict) else dims

    def judge(w: Any) -> str | None:
        if valid != "handled":
            return f"dequantize accepted tensors validate refused ({dims})"
        if not isinstance(w, torch.Tensor) or w.dtype != torch.float64 or w.numel() != math.prod(sizes):
            return f"dequantize returned {w!r:.80}, expected float64 with {math.prod(sizes)} elements"
        if done and all(d.endswith(tuple(LAYOUTS)) for d in done):
            ref = fmt.dequantize(original)
            if not _same(w, ref):
                return "a layout-only change (same values) dequantized differently"
        return None

    attempt(f"dequantize:{name}", lambda: fmt.dequantize(tensors), names=names, context=context, judge=judge)


@pytest.mark.parametrize("name", SEEDED)
@settings(max_examples=examples("fast"))
@given(data=st.data())
def test_validate_and_dequantize(name: str, data: st.DataObject) -> None:
    """The validator and the golden dequantizer on mutated stored tensors (see
    :func:`check_dequantize`). For a format an op writes, ``validate`` checks the layer's
    tensors and ``dequantize`` reads the op's outputs: those are fuzzed in
    :func:`test_op_outputs`."""
    case = data.draw(st.sampled_from(seeds_for(name)), label="seed")
    fmt = case.format
    original = seed_tensors(case)
    foreign = [seed_tensors(c) for c in data.draw(st.lists(st.sampled_from(seed_cases()), min_size=1, max_size=2), label="foreign")]
    if data.draw(st.integers(0, 3), label="reparameterize") == 0:
        desc, fmt = reparameterize(data, fmt)
        done, tensors = [desc] if desc else [], dict(original)
        original = tensors if fmt != case.format else original
    else:
        done, tensors = mutate_tensors(data, original, foreign)
    names = names_for(fmt, original, tensors)

    def context() -> str:
        return f"{case.id}: {'; '.join(done)}"

    if _writer(name):
        attempt(f"validate:{name}", lambda: fmt.validate(tensors), names=names, context=context, judge=valid_dims(fmt))
        return
    check_dequantize(fmt, fmt.validate, valid_dims(fmt), tensors, original, done, name, names, context)


@pytest.mark.parametrize("name", OUTPUT_FORMATS)
@settings(max_examples=examples("fast"))
@given(data=st.data())
def test_op_outputs(name: str, data: st.DataObject) -> None:
    """A format an op writes: its output validator and golden dequantizer on mutated
    golden outputs (of a random activation), as :func:`check_dequantize` says."""
    oracle = _writer(name)
    assert oracle is not None
    case = data.draw(st.sampled_from(seeds_for(name)), label="seed")
    fmt, layer = case.format, seed_tensors(case)
    inputs = oracle.nominal(data, fmt.validate(layer), case.act_dtype)
    original = oracle.outputs(fmt, layer, inputs)
    assert original is not None
    foreign = [seed_tensors(c) for c in data.draw(st.lists(st.sampled_from(seed_cases()), min_size=1, max_size=2), label="foreign")]
    if data.draw(st.integers(0, 3), label="reparameterize") == 0:
        desc, fmt = reparameterize(data, fmt)
        done, tensors = [desc] if desc else [], dict(original)
    else:
        done, tensors = mutate_tensors(data, original, foreign)
    names = names_for(fmt, original, tensors)
    check_dequantize(fmt, fmt.validate_output, positive_sizes, tensors, original, done, name, names,  # type: ignore[attr-defined]
                     lambda: f"{case.id}: {'; '.join(done)}")


def _takes_weight(name: str) -> bool:
    params = list(inspect.signature(format_classes()[name].quantize).parameters)
    return len(params) > 1 and params[1] == "weight"


#: Formats whose golden quantizer takes a dense weight (the others quantize an op's input).
WEIGHT_FORMATS = [n for n in SEEDED if _takes_weight(n)]


@pytest.mark.parametrize("name", WEIGHT_FORMATS)
@settings(max_examples=examples("fast"))
@given(data=st.data())
def test_golden_quantizer(name: str, data: st.DataObject) -> None:
    """The golden quantizer on bad dense weights (wrong rank, dtype, empty, NaN/Inf,
    huge, subnormal, non-contiguous): it refuses, or writes tensors its own validator
    accepts whose dequantization is finite and no further from the weight than zero is."""
    case = data.draw(st.sampled_from(seeds_for(name)), label="seed")
    fmt = case.format
    dense = fmt.dequantize(seed_tensors(case), dtype=torch.float32)
    done, mutated = mutate_tensors(data, {"weight": dense}, [], max_mutations=2)
    weight = mutated.get("weight")
    seed = data.draw(st.integers(0, 2**31 - 1), label="generator")

    def judge(out: Any) -> str | None:
        try:
            fmt.validate(out)
        except QuantCoreError as exc:
            return f"the golden quantizer wrote tensors its validator refuses: {exc}"
        w = fmt.dequantize(out).cpu()  # quantized where the weight lay (CUDA on a GPU host)
        if not torch.isfinite(w).all():
            return "the golden quantizer wrote a checkpoint that dequantizes to NaN/Inf"
        ref = weight.detach().to("cpu", torch.float64)  # type: ignore[union-attr]
        if w.shape != ref.shape:
            return f"dequantized shape {tuple(w.shape)} for a weight of {tuple(ref.shape)}"
        if (w - ref).norm() > ref.norm() * (1 + 1e-6) + 1e-30:
            return f"relative error {((w - ref).norm() / ref.norm()).item():.3g} > 1 (worse than all zeros)"
        return None

    attempt(
        f"quantize:{name}", lambda: fmt.quantize(weight, generator=torch.Generator().manual_seed(seed)),  # type: ignore[arg-type]
        names=["weight", *(f.name for f in _fields(type(fmt)))], judge=judge,
        context=lambda: f"{case.id}: {'; '.join(done)}",
    )


@pytest.mark.parametrize("name", OUTPUT_FORMATS)
@settings(max_examples=examples("fast"))
@given(data=st.data())
def test_golden_input_quantizer(name: str, data: st.DataObject) -> None:
    """The golden quantizer of a format an op writes, on the op's input mutated as a
    kernel call's is (wrong dtype, shape, device, layout; NaN/Inf, huge, subnormal): it
    refuses, or writes what the op's oracle accepts (see its ``check_outputs``)."""
    oracle = _writer(name)
    assert oracle is not None
    case = data.draw(st.sampled_from(seeds_for(name)), label="seed")
    fmt, layer = case.format, seed_tensors(case)
    dims = fmt.validate(layer)
    desc, inputs = oracle.mutate(data, oracle.nominal(data, dims, case.act_dtype), dims)
    attempt(
        f"quantize:{name}", lambda: oracle.outputs(fmt, layer, inputs),
        names=names_for(fmt, layer, inputs), judge=lambda out: oracle.check_outputs(fmt, layer, inputs, out),
        context=f"{case.id}: {desc}",
    )
