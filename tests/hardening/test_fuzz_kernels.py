"""Fuzzed bad inputs for every kernel's entry points: ``prepare`` (mutated stored
tensors, wrong ``dtype``), the call (mutated activations and routing, a prepared state
that is not this kernel's), ``bind``, ``supports`` and ``get_kernel``.

Every kernel the registry holds that can run on the fuzz device is fuzzed (the CPU by
default, where the Triton ones run under the interpreter, with fewer examples; CUDA with
``QUANTCORE_FUZZ_DEVICE=cuda --qc-device cuda``); the oracle of each op
(``fuzz/op_oracles.py``) gives the golden output of whatever a kernel accepted, computed
from the tensors as the format defines them. A kernel may refuse anything with a
quantcore error naming the tensor or parameter; what it accepts it must get right.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore.binding import bind
from quantcore.errors import NoKernelError, QuantCoreError
from quantcore.formats.base import Format
from quantcore.kernel import Kernel, Support
from quantcore.problem import MAX_DIM, Problem
from quantcore.registry import KernelEntry, Registry
from quantcore.selection import explain, get_kernel
from quantcore.selection.state import selection_state

from .fuzz.mutations import ALL_DTYPES, FLOAT_DTYPES, LAYOUTS, mutate_tensors, reparameterize
from .fuzz.op_oracles import oracle_for
from .fuzz.oracles import OpOracle, place
from .fuzz.profiles import examples
from .fuzz.seeds import (
    DEVICE,
    make_kernel,
    registry,
    runnable_kernels,
    seed_cases,
    seed_tensors,
    seeds_for,
)
from .fuzz.tally import attempt

COMMON_NAMES = ("tensors", "weight", "in_features", "out_features", "K", "N", "E", "M", "T", "dtype", "g_idx")


def _interpreted(entry: KernelEntry) -> bool:
    return "triton" in entry.cls.requires.packages and DEVICE == "cpu"


def interpreters_view(inputs: dict[str, Any]) -> dict[str, Any]:
    """The inputs as Triton's interpreter reads them: it converts a subnormal bf16 to
    float32 as zero (docs/triton-interpreter.md), where a compiled kernel converts it
    exactly. An interpreted call's golden output is computed on this view, so the check
    still holds the kernel to everything else it was given."""
    tiny = torch.finfo(torch.bfloat16).smallest_normal
    return {k: v.masked_fill((v != 0) & (v.abs() < tiny), 0)
            if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16 else v for k, v in inputs.items()}


KERNELS = [e for e in runnable_kernels() if seeds_for(e.cls.format, e.cls.op) and oracle_for(e.cls.op)]
FAST = [e for e in KERNELS if not _interpreted(e)]
SLOW = [e for e in KERNELS if _interpreted(e)]


def _id(e: KernelEntry) -> str:
    return f"{e.cls.format}/{e.cls.name}"


def test_every_runnable_kernel_is_fuzzed() -> None:
    """A kernel that can run here but has no seeds or no op oracle would escape."""
    missing = [_id(e) for e in runnable_kernels() if e not in KERNELS]
    assert not missing, f"kernels runnable here but not fuzzed (no seed case or no op oracle): {missing}"


def names_for(fmt: Format, oracle: OpOracle, *tensor_sets: Mapping[str, Any]) -> list[str]:
    import dataclasses

    fields = [f.name for f in dataclasses.fields(fmt)]  # type: ignore[arg-type]
    return sorted({n for t in tensor_sets for n in t} | set(fields) | set(oracle.arg_names) | set(COMMON_NAMES))


def meaning(fmt: Format, tensors: Mapping[str, Any], device: torch.device) -> tuple[dict[str, torch.Tensor] | None, str]:
    """The tensors as the format reads them, on the kernel's device, or None and why not."""
    if not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        return None, "not all tensors"
    if any(t.device.type == "meta" for t in tensors.values()):
        return None, "meta tensors"
    moved = {k: t.to(device) for k, t in tensors.items()}
    try:
        fmt.validate(moved)
    except QuantCoreError as exc:
        return None, str(exc)
    return moved, ""


class Runner:
    """One example against one kernel: the kernel, its format's seed, the op oracle."""

    def __init__(self, entry: KernelEntry, data: st.DataObject, *, supported: bool) -> None:
        self.entry, self.data = entry, data
        self.oracle = oracle_for(entry.cls.op)
        assert self.oracle is not None
        seeds = seeds_for(entry.cls.format, entry.cls.op)
        if supported:
            ok = [c for c in seeds if entry.cls.supports(c.problem)]
            seeds = tuple(ok) or seeds
        self.case = data.draw(st.sampled_from(seeds), label="seed")
        self.fmt = self.case.format
        self.tensors = seed_tensors(self.case)
        self.kernel: Kernel = make_kernel(entry, self.fmt)
        self.name = entry.cls.name
        self.log: list[str] = [self.case.id]

    def context(self) -> str:
        return " | ".join(self.log)

    def names(self, *extra: Mapping[str, Any]) -> list[str]:
        assert self.oracle is not None
        return names_for(self.fmt, self.oracle, self.tensors, *extra)

    def judge_call(self, out: Any, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: dict[str, Any]) -> str | None:
        assert self.oracle is not None
        try:
            return self.oracle.judge(out, fmt, tensors, inputs)
        except Exception as exc:
            return f"accepted an input the golden reference cannot compute ({type(exc).__name__}: {exc})"

    def check_prepared(self, prepared: Any, tensors: Mapping[str, Any], dtype: Any) -> str | None:
        """After an accepted ``prepare``: the tensors must mean something, and a nominal
        call (in the prepared dtype, else any the kernel takes) must match the golden."""
        assert self.oracle is not None
        read, why = meaning(self.fmt, tensors, self.kernel.device)
        if read is None:
            return f"prepare accepted tensors the format refuses ({why})"
        dims = self.fmt.validate(read)
        first = [dtype] if isinstance(dtype, torch.dtype) else [self.case.act_dtype]
        for act in dict.fromkeys([*first, *FLOAT_DTYPES]):
            inputs = place(self.oracle.nominal(self.data, dims, act), self.kernel.device)
            try:
                out = self.oracle.call(self.kernel, prepared, inputs)
            except QuantCoreError:
                continue
            except Exception as exc:
                return f"the call after an accepted prepare raised {type(exc).__name__}: {exc}"
            return self.judge_call(out, self.fmt, read, inputs)
        return "prepare accepted the weight, but then no activation dtype was accepted"

    def prepare(self, tensors: Mapping[str, Any], dtype: Any = None, **kw: Any) -> tuple[str, Any]:
        return attempt(
            f"prepare:{self.name}", lambda: self.kernel.prepare(tensors, dtype=dtype),  # type: ignore[arg-type]
            names=self.names(tensors), judge=lambda p: self.check_prepared(p, tensors, dtype),
            context=self.context, **kw,
        )


def scenario_weights(r: Runner) -> None:
    foreign = [seed_tensors(c) for c in r.data.draw(st.lists(st.sampled_from(seed_cases()), min_size=1, max_size=2), label="foreign")]
    if r.data.draw(st.integers(0, 3), label="reparameterize") == 0:
        # The tensors as they are, read under another parameterisation of the format.
        desc, fmt = reparameterize(r.data, r.fmt)
        if desc:
            r.fmt, r.kernel = fmt, make_kernel(r.entry, fmt)
        done, mutated = ([desc] if desc else []), dict(r.tensors)
    else:
        done, mutated = mutate_tensors(r.data, r.tensors, foreign)
    dtype = r.data.draw(st.sampled_from((None, r.case.act_dtype)), label="prepare dtype")
    r.log += [*done, f"prepare(dtype={dtype})"]
    layout_only = bool(done) and all(d.endswith(tuple(LAYOUTS)) for d in done)
    outcome, _ = r.prepare(mutated, dtype)
    if outcome == "refused" and layout_only:
        # Same values in another layout: refused only if the original is refused too.
        r.log.append("original")
        original, _ = r.prepare(r.tensors, dtype)
        assert original == "refused", f"prepare:{r.name} refused a layout-only change of a weight it takes\n{r.context()}"


def scenario_inputs(r: Runner) -> None:
    assert r.oracle is not None
    outcome, prepared = r.prepare(r.tensors)
    if outcome != "handled":
        return
    dims = r.fmt.validate(r.tensors)
    inputs = place(r.oracle.nominal(r.data, dims, r.case.act_dtype), r.kernel.device)
    desc, mutated = r.oracle.mutate(r.data, inputs, dims)
    r.log.append(desc)
    before = {k: v.detach().clone() for k, v in mutated.items() if isinstance(v, torch.Tensor) and v.device.type != "meta"}

    def judge(out: Any) -> str | None:
        for k, v in before.items():
            now = mutated[k]
            if not (torch.equal(now, v) or (now.is_floating_point() and torch.equal(now.isnan(), v.isnan())
                                             and torch.equal(now.nan_to_num(), v.nan_to_num()))):
                return f"the call wrote into its input {k}"
        return r.judge_call(out, r.fmt, r.tensors, interpreters_view(mutated) if _interpreted(r.entry) else mutated)

    attempt(
        f"call:{r.name}", lambda: r.oracle.call(r.kernel, prepared, mutated),  # type: ignore[union-attr]
        names=r.names(), judge=judge, context=r.context,
    )


def scenario_prepared(r: Runner) -> None:
    """A prepared state that is not what this kernel's prepare made for this weight."""
    assert r.oracle is not None
    kind = r.data.draw(st.sampled_from(("None", "dict", "stored tensors", "string", "other kernel", "other weight")), label="prepared kind")
    donor: tuple[Format, Mapping[str, torch.Tensor]] | None = None
    if kind == "None":
        bad: Any = None
    elif kind == "dict":
        bad = {}
    elif kind == "stored tensors":
        bad = dict(r.tensors)
    elif kind == "string":
        bad = "prepared"
    else:
        if kind == "other kernel":
            entry = r.data.draw(st.sampled_from([e for e in KERNELS if e.cls is not r.entry.cls]), label="other kernel")
        else:
            entry = r.entry
        case = r.data.draw(st.sampled_from(seeds_for(entry.cls.format, entry.cls.op)), label="donor seed")
        other = make_kernel(entry, case.format)
        try:
            bad = other.prepare(seed_tensors(case))
            donor = (case.format, seed_tensors(case))
        except QuantCoreError:
            bad = None
        r.log.append(f"prepared by {entry.cls.name} for {case.id}")
    r.log.append(f"prepared: {kind}")
    dims = r.fmt.validate(r.tensors)
    inputs = place(r.oracle.nominal(r.data, dims, r.case.act_dtype), r.kernel.device)

    def judge(out: Any) -> str | None:
        if donor is None:
            return f"accepted {kind} as a prepared state"
        return r.judge_call(out, donor[0], donor[1], inputs)

    attempt(
        f"call:{r.name}", lambda: r.oracle.call(r.kernel, bad, inputs),  # type: ignore[union-attr]
        names=r.names(), judge=judge, context=r.context,
    )


def scenario_dtype(r: Runner) -> None:
    dtype = r.data.draw(st.sampled_from((None, *ALL_DTYPES, "bf16", 16, torch.float64)), label="dtype")
    r.log.append(f"prepare(dtype={dtype!r})")
    r.prepare(r.tensors, dtype)


SCENARIOS = {"weights": scenario_weights, "inputs": scenario_inputs, "prepared": scenario_prepared, "dtype": scenario_dtype}
WEIGHTS = ("weights", "weights", "inputs", "inputs", "inputs", "prepared", "dtype")


def run_example(entry: KernelEntry, data: st.DataObject) -> None:
    scenario = data.draw(st.sampled_from(WEIGHTS), label="scenario")
    runner = Runner(entry, data, supported=scenario != "weights")
    runner.log.insert(0, scenario)
    SCENARIOS[scenario](runner)


@pytest.mark.parametrize("entry", FAST, ids=_id)
@settings(max_examples=examples("kernel"))
@given(data=st.data())
def test_kernel(entry: KernelEntry, data: st.DataObject) -> None:
    run_example(entry, data)


@pytest.mark.parametrize("entry", SLOW, ids=_id)
@settings(max_examples=examples("slow"))
@given(data=st.data())
def test_interpreted_kernel(entry: KernelEntry, data: st.DataObject) -> None:
    run_example(entry, data)


# --- bind: the whole selection on one weight ---------------------------------------------------


@pytest.fixture(scope="module")
def bind_registry() -> Registry:
    return Registry().load()


BIND_FORMATS = sorted({c.format.name for c in seed_cases() if oracle_for(c.op)})


@pytest.mark.parametrize("name", BIND_FORMATS)
@settings(max_examples=examples("kernel"))
@given(data=st.data())
def test_bind(name: str, data: st.DataObject, bind_registry: Registry) -> None:
    """``bind`` tries candidates in turn on mutated tensors: the caller's bad input is
    raised at once (never blamed on a kernel: no failure is recorded), and what binds
    computes the golden output."""
    case = data.draw(st.sampled_from(seeds_for(name)), label="seed")
    fmt, tensors = case.format, seed_tensors(case)
    oracle = oracle_for(case.op)
    assert oracle is not None
    foreign = [seed_tensors(c) for c in data.draw(st.lists(st.sampled_from(seed_cases()), min_size=1, max_size=1), label="foreign")]
    done, mutated = mutate_tensors(data, tensors, foreign)

    def judge(bound: Any) -> str | None:
        read, why = meaning(fmt, mutated, torch.device(DEVICE))
        if read is None:
            return f"bound tensors the format refuses ({why})"
        refusals = []
        # The dtype of the case first; without a dtype, a kernel may prepare for the
        # stored tensors' own (svdquant: lora_down's).
        for act in dict.fromkeys([case.act_dtype, *FLOAT_DTYPES]):
            inputs = place(oracle.nominal(data, fmt.validate(read), act), DEVICE)
            try:
                out = bound(*[inputs[k] for k in ("x", "topk_ids") if k in inputs], **(
                    {"topk_weights": inputs["topk_weights"]} if "topk_weights" in inputs else {}))
            except QuantCoreError as exc:
                refusals.append(str(exc))
                continue
            return oracle.judge(out, fmt, read, inputs)
        return f"bound, then refused a nominal call in every dtype: {refusals}"

    try:
        attempt(
            f"bind:{name}", lambda: bind(fmt, DEVICE, mutated, registry=bind_registry),
            names=names_for(fmt, oracle, tensors, mutated), judge=judge,
            context=lambda: f"{case.id}: {'; '.join(done)}", unnamed=(NoKernelError,),
        )
        assert not selection_state(bind_registry).failures, (
            f"a bad input was blamed on a kernel: {selection_state(bind_registry).failures}\n{case.id}: {'; '.join(done)}"
        )
    finally:
        selection_state(bind_registry).clear_failures()


# --- supports and selection: never raise, whatever the problem ----------------------------------


ALL_KERNEL_CLASSES = sorted({e.cls for e in registry().kernels()}, key=lambda c: (c.format, c.op, c.name))


def problems() -> st.SearchStrategy[Problem]:
    """Problems that can be built: any format, op and float dtype, dims anywhere in
    ``[0, MAX_DIM]`` (``test_fuzz_dims`` fuzzes the ones that cannot)."""
    formats = st.sampled_from([c.format for c in seed_cases()])
    dims = st.dictionaries(
        st.sampled_from(("M", "K", "N", "E", "T", "topk", "R", "bogus")),
        st.sampled_from((0, 1, 3, 7, 8, 16, 40, 64, 96, 128, 256, 4096, MAX_DIM)),
        max_size=5,
    )
    dtypes = st.sampled_from([d for d in ALL_DTYPES if d.is_floating_point])
    ops = st.sampled_from(("", "linear", "moe", "act_quant_lora", "bogus"))
    return st.builds(lambda f, d, t, o: Problem.of(f, d, t, o or None), formats, dims, dtypes, ops)


@settings(max_examples=examples("fast"))
@given(problem=problems(), kernel=st.sampled_from(ALL_KERNEL_CLASSES))
def test_supports_never_raises(problem: Problem, kernel: type[Kernel]) -> None:
    """``supports`` answers (ok, reason) for any problem, another format's or absurd
    dims included: it is how get_kernel asks, and it must not touch a device."""

    def judge(s: Any) -> str | None:
        if not isinstance(s, tuple) or len(s) != 2 or not isinstance(s[1], str):
            return f"returned {s!r}, not a Support"
        if not s[0] and not s[1]:
            return "refused without a reason"
        return None

    attempt(f"supports:{kernel.name}", lambda: Support(*kernel.supports(problem)), names=(), judge=judge,
            allow_refusal=False, context=lambda: f"{kernel.name}.supports({problem})")


@settings(max_examples=examples("fast"))
@given(
    fmt=st.one_of(st.sampled_from([c.format for c in seed_cases()]), st.sampled_from(("gptq", "awq", "gtpq", "", "GPTQ"))),
    device=st.sampled_from(("cpu", "cuda", "cuda:0", "xpu", "npu", "meta", "cuda:x", "", "tpu", "cpu:0", "CPU")),
    problem=st.one_of(st.none(), problems()),
    prefer=st.one_of(st.none(), st.sampled_from(("aten_cpu", "nonexistent", ""))),
)
def test_selection(fmt: Any, device: str, problem: Problem | None, prefer: str | None) -> None:
    """get_kernel and explain on any format name, device string and problem: a kernel,
    or a quantcore error (the explain table when nothing can run)."""
    names = ("format", "device", "problem", "prefer", "problem.format")
    attempt("select:get_kernel", lambda: get_kernel(fmt, device, problem=problem, prefer=prefer, registry=registry()),
            names=names, judge=lambda k: None if isinstance(k, Kernel) else f"returned {k!r}",
            unnamed=(NoKernelError,), context=f"get_kernel({fmt!r}, {device!r}, problem={problem}, prefer={prefer!r})")
    attempt("select:explain", lambda: explain(fmt, device, problem=problem, prefer=prefer, registry=registry()).table(),
            names=names, judge=lambda t: None if isinstance(t, str) else f"returned {t!r}",
            context=f"explain({fmt!r}, {device!r}, problem={problem}, prefer={prefer!r})")
