"""Defects of prepared state, plugins, the matrix, kernels and arguments, each pinned as a
fixed example (the fuzz suites beside this file generate their kind)."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import torch

import quantcore
from quantcore import binding
from quantcore import registry as registry_module
from quantcore.backends.torch_fallback import fallback_for
from quantcore.binding import bind
from quantcore.cli.main import main
from quantcore.conformance.runner import FAIL, PASS, Cell, run_cell
from quantcore.errors import (
    InvalidArgumentError,
    KernelInputError,
    PluginError,
    TensorFormatError,
    UnsupportedProblemError,
)
from quantcore.formats.gptq import GPTQ
from quantcore.formats.turboquant import TurboQuant
from quantcore.kernel import Requirements
from quantcore.nn.linear import QuantLinear
from quantcore.problem import MAX_DIM, Problem
from quantcore.registry import ENTRY_POINT_GROUP, KernelEntry, Registry
from quantcore.registry import manager as manager_module
from quantcore.selection import explain, get_kernel
from quantcore.selection.state import selection_state

from ..core.fakes import Plugin, dense_kernel
from ..interpreting import INTERPRETER, NOT_INTERPRETED
from .fuzz.seeds import seeds_for
from .test_fuzz_matrix import evil_kernel
from .test_fuzz_plugins import Contributes, FakeDist, FakeEntryPoint, impostor_format

REPO = Path(__file__).resolve().parents[2]
FMT = GPTQ(group_size=32, sym=False)
P = Problem.linear(FMT, M=2, K=128, N=64, dtype=torch.float32)


def weights(seed: int = 0, scale: float = 1.0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return FMT.quantize(torch.randn(64, 128, generator=gen) * scale, generator=gen)


def skeleton() -> QuantLinear:
    with torch.device("meta"):
        return QuantLinear(FMT, in_features=128, out_features=64, dtype=torch.float32)


# --- prepared state handed back ----------------------------------------------------------------


@pytest.mark.parametrize("cut", ["empty", "one row short"])
def test_a_truncated_prepared_buffer_is_refused_before_the_op(cut: str) -> None:
    """It reached ``aten._weight_int4pack_mm_for_cpu``: an empty buffer was a SIGSEGV,
    one row short gave NaN. Run in a child process: a crash shows as its exit status."""
    script = f"""
import torch
from quantcore.errors import TensorFormatError
from quantcore.formats.gptq import GPTQ
from quantcore.nn.linear import QuantLinear
fmt = GPTQ(group_size=32, sym=False)
gen = torch.Generator().manual_seed(0)
layer = QuantLinear(fmt, fmt.quantize(torch.randn(64, 128, generator=gen), generator=gen), dtype=torch.float32)
assert layer.kernel.name == "aten_cpu"
state = dict(layer.state_dict())
state["weight"] = state["weight"][:0] if {cut!r} == "empty" else state["weight"][:-1]
with torch.device("meta"):
    skeleton = QuantLinear(fmt, in_features=128, out_features=64, dtype=torch.float32)
try:
    skeleton.load_state_dict(state, assign=True)
    skeleton(torch.randn(2, 128))
except TensorFormatError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "weight: expected uint8 [64, 64], got uint8 [" in out.stdout


@pytest.mark.parametrize("tamper", ["dtype", "group_size in the spec", "names", "spec garbage", "version",
                                    "extra not a dict", "missing buffer", "another kernel"])
def test_a_tampered_state_dict_is_a_tensor_format_error_naming_what(tamper: str) -> None:
    layer = QuantLinear(FMT, weights(), dtype=torch.float32)
    state = dict(layer.state_dict())
    extra = dict(state["_extra_state"])
    state["_extra_state"] = extra
    if tamper == "dtype":
        state["by_dtype_float32_0"] = state["by_dtype_float32_0"].half()
        match = "by_dtype_float32_0: expected float32"
    elif tamper == "group_size in the spec":
        extra["spec"] = extra["spec"].replace('"group_size":32,"in', '"group_size":64,"in')
        match = "by_dtype_float32_0: expected float32 \\[2, 64, 2\\]"
    elif tamper == "names":
        extra["names"] = ["weight", "forward"]
        match = "names"
    elif tamper == "spec garbage":
        extra["spec"] = "{not json"
        match = "spec: not JSON"
    elif tamper == "version":
        extra["version"] = "1"
        match = "_extra_state: version '1'"
    elif tamper == "extra not a dict":
        state["_extra_state"] = ["spec"]
        match = "_extra_state: expected a dict"
    elif tamper == "missing buffer":
        del state["weight"]
        match = "weight: missing from the state dict"
    else:
        extra["spec"] = extra["spec"].replace('"name":"aten_cpu"', '"name":"torch_fallback"')
        match = "expected a DenseWeight"
    with pytest.raises(TensorFormatError, match=match):
        skeleton().load_state_dict(state, strict=False, assign=True)


def test_a_state_of_views_loads_as_laid_out_copies() -> None:
    """Found by the state fuzz: a non-contiguous buffer assigned into the module made the
    CPU int4pack op read the wrong bytes (silently wrong) or refuse (a raw RuntimeError)."""
    layer = QuantLinear(FMT, weights(), dtype=torch.float32)
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(5))
    state = dict(layer.state_dict())
    cast = state["by_dtype_float32_0"]
    state["by_dtype_float32_0"] = torch.zeros(cast.numel() * 2).as_strided(cast.shape, [s * 2 for s in cast.stride()])
    state["by_dtype_float32_0"].copy_(cast)
    target = skeleton()
    target.load_state_dict(state, assign=True)
    assert torch.equal(target(x), layer(x))


def test_a_buffer_of_another_dtype_is_not_cast_into_the_one_held() -> None:
    """Found by the nightly state fuzz: a bf16 bias loaded (without ``assign``) into a layer
    holding an fp16 one passed the kernel's schema (its prepare makes either) and torch cast
    it into the buffer: a different bias, silently. Now refused, naming the buffer."""
    tensors = weights()
    tensors["bias"] = torch.randn(64, generator=torch.Generator().manual_seed(6)).half()
    layer = QuantLinear(FMT, tensors, dtype=torch.float32, prefer="aten_cpu")
    state = dict(layer.state_dict())
    assert state["bias"].dtype == torch.float16
    rounded = state["bias"].to(torch.bfloat16)
    assert not torch.equal(rounded.half(), state["bias"])  # the cast would change values
    state["bias"] = rounded
    target = QuantLinear(FMT, {k: v.clone() for k, v in tensors.items()}, dtype=torch.float32, prefer="aten_cpu")
    with pytest.raises(TensorFormatError, match=r"bias: expected float16 .*got .*bfloat16"):
        target.load_state_dict(state)
    assert torch.equal(target.bias, tensors["bias"])  # nothing was copied


def test_a_state_of_a_kernel_that_cannot_run_here_blocks_the_module() -> None:
    """Found by the nightly state fuzz: a spec naming a CUDA-only kernel, loaded on a CPU,
    derived that kernel's schema by preparing on the CPU (a raw AssertionError)."""
    from quantcore.formats.trtllm_moe import TRTLLMMoE
    from quantcore.nn.quant_module import QuantModule

    fmt = TRTLLMMoE(sym=False, scale_dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    t = fmt.quantize(torch.randn(1, 128, 256, generator=gen) * 0.05)
    module = QuantModule(fmt, t, dtype=torch.bfloat16, prefer="trtllm_moe_torch")
    state = dict(module.state_dict())
    state["_extra_state"] = {**state["_extra_state"],
                             "spec": state["_extra_state"]["spec"].replace('"trtllm_moe_torch"', '"tensorrt_llm"')}
    target = QuantModule(fmt, t, dtype=torch.bfloat16, prefer="trtllm_moe_torch")
    target.load_state_dict(state)
    assert target.kernel is not None and target.kernel.name == "tensorrt_llm"
    with pytest.raises(KernelInputError, match=r"tensorrt_llm prepared this .* and cannot run it on cpu"):
        target(torch.randn(1, 128, dtype=torch.bfloat16), torch.zeros(1, 1, dtype=torch.int32))


@pytest.mark.skipif(not INTERPRETER, reason=f"triton_int4 makes the state on the CPU: {NOT_INTERPRETED}")
def test_a_state_of_a_kernel_whose_package_is_too_old_here_blocks_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found under torch 2.6 with Triton 3.2: a state naming a Triton kernel, loaded where
    that kernel is refused for the installed Triton, was launched and raised a raw
    ImportError; the module is now blocked at the load with the kernel's reason."""
    import dataclasses

    from quantcore.nn import quant_module
    from quantcore.probe import PackageStatus, probe

    fmt = GPTQ(bits=4, group_size=64, sym=True)
    t = fmt.quantize(torch.randn(64, 128, generator=torch.Generator().manual_seed(0)) * 0.05)
    state = QuantLinear(fmt, t, prefer="triton_int4").state_dict()
    old = dataclasses.replace(probe("cpu"), packages=(PackageStatus("triton", "3.2.0", True),))
    monkeypatch.setattr(quant_module, "probe", lambda device: old)
    target = QuantLinear(fmt, t, prefer="aten_cpu")
    target.load_state_dict(state)
    assert target.kernel is not None and target.kernel.name == "triton_int4"
    with pytest.raises(KernelInputError, match=r"triton_int4 prepared this .* and cannot run it on cpu: package "
                                               r"triton: 3.2.0 installed, needs 3.6 or newer"):
        target(torch.randn(2, 128, dtype=torch.bfloat16))


@pytest.mark.parametrize("tamper", ["index moved", "names swapped"])
def test_buffers_of_one_shape_cannot_stand_in_for_each_other(tamper: str) -> None:
    """Found by the nightly state fuzz: pass 2's ``scales`` pointed at pass 1's (same
    shape, same dtype) in the spec's tree, and the layer computed a wrong result."""
    from quantcore.nn.turboquant import TurboQuantLinear

    fmt = TurboQuant(bits=2, group_size=128, residual=True)
    gen = torch.Generator().manual_seed(0)
    layer = TurboQuantLinear.from_linear(torch.nn.Linear(256, 96), fmt, generator=gen, dtype=torch.float32)
    state = dict(layer.state_dict())
    extra = dict(state["_extra_state"])
    state["_extra_state"] = extra
    names = list(extra["names"])
    if tamper == "index moved":
        spec = json.loads(extra["spec"])
        spec["state"]["f"]["passes"]["t"][1]["f"]["scales"]["T"] = names.index("passes_0_scales")
        extra["spec"] = json.dumps(spec, sort_keys=True, separators=(",", ":"))
        match = "refers to its tensors otherwise than prepare does"
    else:
        i, j = names.index("passes_0_scales"), names.index("passes_1_scales")
        names[i], names[j] = names[j], names[i]
        extra["names"] = names
        match = "do not name the places of the prepared state"
    target = TurboQuantLinear(256, 96, fmt, dtype=torch.float32)
    with pytest.raises(TensorFormatError, match=match):
        target.load_state_dict(state)


def test_set_extra_state_alone_takes_only_the_layout_the_module_holds() -> None:
    layer = QuantLinear(FMT, weights(), dtype=torch.float32)
    extra = layer.get_extra_state()
    layer.set_extra_state(extra)
    with pytest.raises(TensorFormatError, match="another prepared state"):
        layer.set_extra_state({**extra, "names": ["weight", "other"]})
    with pytest.raises(TensorFormatError, match="_extra_state: expected a dict"):
        layer.set_extra_state(None)


def test_the_custom_op_checks_the_state_it_is_given() -> None:
    from quantcore.custom_ops import call_op

    layer = QuantLinear(FMT, weights(), dtype=torch.float32)
    state = layer.state_tensors()
    with pytest.raises(TensorFormatError, match="state\\[0\\]: expected uint8 \\[64, 64\\], got uint8 \\[63, 64\\]"):
        call_op("linear", layer._spec, [state[0][:-1], *state[1:]], torch.randn(2, 128))
    # Views (as an exported program's buffers may be) are laid out on every call, not
    # only the first: the op reads its operands' storage.
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(6))
    views = []
    for t in state:
        wide = torch.zeros(t.numel() * 2, dtype=t.dtype).as_strided(t.shape, [s * 2 for s in t.stride()])
        views.append(wide.copy_(t))
    for _ in range(2):
        assert torch.equal(call_op("linear", layer._spec, views, x), layer(x))


# --- plugins -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["aaa_vendor", "zzz_vendor"])
def test_an_impostor_never_replaces_a_builtin(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin that registered ``aten_cpu`` or ``gptq`` replaced the built-in when its
    entry point sorted first; now it is the plugin's error whatever its name."""
    impostor = dense_kernel("aten_cpu", priority=10_000)
    real = manager_module._entry_points
    fake = FakeEntryPoint(name, Contributes([impostor], [impostor_format("gptq")]), FakeDist("vendor"))
    monkeypatch.setattr(manager_module, "_entry_points",
                        lambda group: [*real(group), fake] if group == ENTRY_POINT_GROUP else list(real(group)))
    reg = Registry(blocked=()).load()
    assert reg.kernel("gptq", "linear", "aten_cpu").plugin == "aten_cpu"
    assert reg.formats()["gptq"] is GPTQ
    errors = " ".join(b.error for b in reg.broken() if b.plugin == name)
    assert "'aten_cpu'" in errors and "'gptq'" in errors
    assert type(get_kernel(FMT, "cpu", problem=P, registry=reg)) is not impostor
    assert explain(FMT, "cpu", problem=P, registry=reg).selected.plugin == "aten_cpu"  # type: ignore[union-attr]


def test_a_malformed_requires_breaks_only_its_plugin(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = dense_kernel("bad_requires")
    bad.requires = Requirements(device_types="cpu")  # type: ignore[arg-type]
    registry.register(Plugin(bad), name="bad_requires_plugin")
    monkeypatch.setattr(registry_module, "_default", registry)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["list"]) == 0
    text = out.getvalue()
    assert "bad_requires_plugin [validate] quantcore_kernels returned" in text
    assert "'requires.device_types' must be a non-empty set of device type names, got 'cpu'" in text


# --- the matrix and the run-time fallback -------------------------------------------------------


@pytest.mark.parametrize(("behaviour", "reason"), [
    ("writes x", "the kernel wrote into its input x"),
    ("writes stored", "the kernel wrote into the stored tensor scales"),
    ("supports raises", "check raised ZeroDivisionError: supports raises: vendor check broke at test_fuzz_matrix.py:"),
    ("correct", ""),
])
def test_the_matrix_judges_what_a_user_sees(behaviour: str, reason: str) -> None:
    case = seeds_for("gptq", "linear")[0]
    result = run_cell(Cell(case, KernelEntry(evil_kernel(behaviour), "p")), "cpu")
    assert result.status == (PASS if behaviour == "correct" else FAIL)
    assert reason in result.reason


def test_a_case_without_a_bias_never_shares_weights_drawn_with_one() -> None:
    """Found by the nightly matrix fuzz: cases that differ only by ``bias`` shared one
    weight key, so a cell of the case without it could be judged against a golden drawn
    without the bias and weights (drawn again by the other case) with it."""
    from quantcore.conformance.runner import _inputs, _stored, _weights

    plain = next(c for c in seeds_for("gptq", "linear") if not c.option("bias"))
    biased = next(c for c in seeds_for("gptq", "linear") if c.option("bias") and c.seed_key == plain.seed_key)
    assert plain.weight_key != biased.weight_key
    entry = KernelEntry(evil_kernel("correct"), "p")
    for cache in (_weights, _stored, _inputs):
        cache._data.clear()
    for case in (plain, biased, plain):
        _weights._data.clear()  # evicted between cells, as a longer run does
        _stored._data.clear()
        assert run_cell(Cell(case, entry), "cpu").status == PASS


@pytest.mark.parametrize("behaviour", ["wrong shape", "wrong dtype"])
def test_a_wrong_first_answer_is_a_fallback_with_a_warning(behaviour: str, registry: Registry,
                                                           caplog: pytest.LogCaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    registry.register(Plugin(evil_kernel(behaviour)), name="evil")
    monkeypatch.setattr(registry_module, "_default", registry)
    t, x = weights(1), torch.randn(2, 128)
    ref = x.double() @ FMT.dequantize(t).T
    caplog.set_level(logging.WARNING, logger="quantcore")
    plain = QuantLinear(FMT, t, dtype=torch.float32)  # no source kept: nothing to fall back on
    with pytest.raises(PluginError, match="evil: its first call returned a wrong result"):
        plain(x)
    kept = QuantLinear(FMT, t, dtype=torch.float32, keep_source=True)
    assert ((kept(x).double() - ref).norm() / ref.norm()).item() < 1e-5 and kept.kernel.name == "aten_cpu"
    assert any("its first call returned a wrong result" in r.getMessage() for r in caplog.records)
    selection_state(registry).clear_failures()
    bound = bind(FMT, "cpu", t, problem=P, registry=registry)
    assert ((bound(x).double() - ref).norm() / ref.norm()).item() < 1e-5 and bound.kernel.name == "aten_cpu"


def test_a_failed_bind_leaves_no_lock(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTCORE_FORCE", "no_kernel_here")
    before = len(binding._locks)
    for seed in range(5):
        with pytest.raises(quantcore.NoKernelError):
            bind(FMT, "cpu", weights(seed), problem=P, registry=registry)
    assert len(binding._locks) == before


# --- dense copies keep range ---------------------------------------------------------------------


def test_torch_fallback_keeps_a_dtype_that_holds_the_weight() -> None:
    """fp32 scales whose values exceed float16's range gave Inf everywhere in fp16, where
    the exact outputs are ~1e3; torch_fallback is the default for 8-bit GPTQ on a CPU."""
    fmt = GPTQ(bits=8, group_size=32, sym=False)
    t = fmt.quantize(torch.randn(64, 128, generator=torch.Generator().manual_seed(0)) * 1e4)
    t["scales"] = t["scales"].float() * 1000
    layer = QuantLinear(fmt, t, dtype=torch.float16)
    assert layer.kernel.name == "torch_fallback" and layer.prepared.weight.dtype == torch.float32
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(1)).half() * 1e-5
    ref = x.double() @ fmt.dequantize(t).T
    y = layer(x)
    assert y.dtype == torch.float16 and bool(torch.isfinite(y).all())
    assert ((y.double() - ref).norm() / ref.norm()).item() < 2 * 2**-11
    t["scales"] = torch.full_like(t["scales"], 3e38)  # finite, but the weights reach beyond float32: refused
    with pytest.raises(UnsupportedProblemError, match="beyond float32's range"):
        fallback_for("gptq")(fmt, "cpu").prepare(t)


# --- sizes and arguments -------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [{"K": 2**40, "N": 2**40}, {"K": -128, "N": 64}, {"K": "128", "N": 64}])
def test_impossible_sizes_are_refused_before_allocation(dims: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError, match=r"K: expected"):
        get_kernel(FMT, "cpu", problem=Problem.of(FMT, {"M": 1, **dims}, torch.float32), tune=True)


def test_tuning_a_weight_no_machine_holds_is_refused() -> None:
    p = Problem.linear(FMT, M=1, K=MAX_DIM, N=MAX_DIM)
    with pytest.raises(InvalidArgumentError, match="problem: tuning a K=16777216 × N=16777216 weight needs"):
        explain(FMT, "cpu", problem=p, tune=True)


def test_a_3bit_turboquant_checks_shapes_before_it_scans_indices() -> None:
    """Its indices (here a 2^39-byte expanded view) were scanned before a small tensor's
    shape was checked."""
    fmt = TurboQuant(bits=3, group_size=128)
    n, k = 1 << 20, 1 << 20
    t = {"indices": torch.zeros(1, 1, dtype=torch.uint8).expand(n, k // 2),
         "norms": torch.ones(n, 3, dtype=torch.float16), "rotation": torch.eye(128).unsqueeze(0),
         "codebook": torch.zeros(8)}
    with pytest.raises(TensorFormatError, match=r"norms: expected shape \(1048576, 8192\)"):
        fmt.validate(t)


@pytest.mark.parametrize(("kw", "match"), [
    ({"dtype": "bf16"}, "problem dtype"), ({"dtype": torch.int8}, "problem dtype"),
])
def test_a_problem_takes_only_float_dtypes(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        Problem.linear(FMT, M=1, K=128, N=64, **kw)


def test_prefer_names_something_registered() -> None:
    with pytest.raises(InvalidArgumentError, match="prefer: no registered kernel or plugin is called 'nosuch'"):
        get_kernel(FMT, "cpu", prefer="nosuch")


def test_modules_refuse_a_scalar_no_input_and_an_absent_device() -> None:
    layer = QuantLinear(FMT, weights(), dtype=torch.float32)
    with pytest.raises(KernelInputError, match="x: expected"):
        layer(torch.tensor(1.0))
    with pytest.raises(KernelInputError, match="expected the op's inputs"):
        layer()
    if not torch.cuda.is_available():
        with pytest.raises(InvalidArgumentError, match="device: cuda is not available here"):
            QuantLinear(FMT, weights(), device="cuda")


def test_quantcore_probe_stays_callable() -> None:
    import quantcore.probe

    assert quantcore.probe("cpu").device == "cpu"


# --- threads ----------------------------------------------------------------------------------------


def test_interpreted_triton_launches_take_turns() -> None:
    """8 threads calling a kernel under Triton's interpreter failed intermittently ("Did
    you forget to add @triton.jit?"): its launch state is module-global."""
    script = """
import os, threading
os.environ["TRITON_INTERPRET"] = "1"
import torch
from concurrent.futures import ThreadPoolExecutor
from quantcore.backends.triton_int4.kernel import TritonInt4GPTQ
from quantcore.formats.gptq import GPTQ
fmt = GPTQ(group_size=128, sym=False)
gen = torch.Generator().manual_seed(0)
kernel = TritonInt4GPTQ(fmt, "cpu")
prepared = kernel.prepare(fmt.quantize(torch.randn(256, 128, generator=gen), generator=gen), dtype=torch.float16)
xs = [torch.randn(3, 128, generator=torch.Generator().manual_seed(i)).half() for i in range(8)]
ref = [kernel(x, prepared) for x in xs]
def work(i):
    return all(torch.equal(kernel(xs[i], prepared), ref[i]) for _ in range(3))
with ThreadPoolExecutor(8) as pool:
    print(all(pool.map(work, range(8))))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "True"

