"""hopper_wgmma's gated end, checked without a GPU: which calls take it (``gated_refusal``),
what a gated bucket launches (the plain plan's kernel with ``GATED``, an ``[M, N/2]`` output
at its own row stride, the workspace and pair counters even unsplit), that the twin is made
once per plan, that a plan that cannot end gated and a call being captured run the plan's
launch and the activation's, and ``QuantLinear.gated``'s routing (the kernel's one launch on the direct
route, the two launches otherwise). The kernels compile gated for sm_90a without spills.
The bits are checked on a GPU (``test_gated_cuda.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from quantcore.backends.hopper_wgmma import decode_bucket, launch
from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.plans import DecodePlan, Plan, TritonPlan
from quantcore.formats.gptq import GPTQ
from quantcore.kernels.gated_activation import gated_activation
from quantcore.triton.split_k import SplitKBuffers
from tests.launch_recorder import Recorder, record_launches
from tests.triton_release import needs_gluon_release

from .test_sm90_compile import _bundled_tools, compiled_rows

FMT = GPTQ(bits=4, group_size=128, sym=False)


def _weights(n: int = 512, k: int = 512) -> Any:
    src = FMT.quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(3)) * 0.05)
    return HopperWgmmaGPTQ(FMT, "cpu").prepare(src, dtype=torch.bfloat16)


def test_which_plans_and_weights_can_end_gated() -> None:
    w = _weights()
    for plan in (DecodePlan(1), DecodePlan(4, bm=16), Plan(1, 16, 4, 4), Plan(2, 16, 6, 1, in_flight=True, ws=True)):
        assert launch.gated_refusal(w, plan) == "", plan
    assert "64 rows" in launch.gated_refusal(w, Plan(2, 64, 4, 1, in_flight=True))
    assert "balanced grid" in launch.gated_refusal(w, Plan(2, 16, 4, 1, in_flight=True, stream=1))
    assert "Triton kernels" in launch.gated_refusal(w, TritonPlan())
    assert "I a multiple of 128" in launch.gated_refusal(_weights(n=384), DecodePlan(1))  # I = 192


def test_the_buffers_of_a_gated_launch_are_real_even_unsplit() -> None:
    scales = torch.zeros(1)
    assert SplitKBuffers(1, torch.device("cpu"), scales)(4, 512, 8) == (scales, scales)
    ws, counters = SplitKBuffers(1, torch.device("cpu"), scales, always=True)(4, 512, 8)
    assert ws.numel() >= 4 * 512 and ws.dtype == torch.float32
    assert counters.numel() >= 8 and not counters.any()


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    monkeypatch.delenv(launch.PDL_ENV, raising=False)
    record_launches(monkeypatch, launch)
    return record_launches(monkeypatch, decode_bucket)  # one list: both modules' launches, in order


@pytest.mark.parametrize("plan", [Plan(1, 16, 4, 1), Plan(2, 16, 3, 2), DecodePlan(1), DecodePlan(2, bm=16)],
                         ids=["wgmma", "wgmma-split", "decode", "decode16-split"])
def test_a_gated_bucket_launches_the_plans_kernel_gated(recorded: list[Recorder], plan: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plan)
    w = _weights()
    x = torch.randn(5 if plan.bm >= 8 else 1, 512, dtype=torch.bfloat16)
    y = launch.gated_linear(x, w)
    assert y is not None and y.shape == (x.shape[0], 256) and y.dtype == torch.bfloat16
    plain, gated = recorded  # the plan's bucket is bound first, then its twin
    assert not plain.constexprs["GATED"] and gated.constexprs["GATED"]
    assert {k: v for k, v in plain.constexprs.items() if k != "GATED"} == \
        {k: v for k, v in gated.constexprs.items() if k != "GATED"}
    (_, args), = gated.calls
    wgmma = isinstance(plan, Plan)
    out, ws, counters = args[5], args[6], args[7]
    stride_ym = args[10] if wgmma else args[12]
    assert out is y and stride_ym == 256
    assert ws.dtype == torch.float32 and ws.numel() >= 5 * 512 and counters.dtype == torch.int32
    launch.gated_linear(x, w)  # the twin is kept with the plan's bucket
    assert len(gated.calls) == 2 and len(recorded) == 2


def test_a_plan_that_cannot_end_gated_runs_the_two_launches(recorded: list[Recorder],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: Plan(2, 64, 4, 1, in_flight=True))
    monkeypatch.setattr(launch, "gated_plan_of", lambda m, w, device: None)  # no table row names one
    w = _weights()
    x = torch.randn(3, 512, dtype=torch.bfloat16)
    for _ in range(2):
        y = launch.gated_linear(x, w)
        assert y.shape == (3, 256)
    assert launch.bucket_of(x, w, 3).gated is False  # decided once
    (plain,) = recorded  # no twin bound: the plan's own launch, twice
    assert not plain.constexprs["GATED"] and len(plain.calls) == 2


@pytest.mark.parametrize("alternative", [DecodePlan(2), Plan(1, 16, 4, 2, in_flight=True)], ids=["decode", "wgmma"])
def test_a_triton_plan_ends_gated_through_the_tables_gated_plan(recorded: list[Recorder],
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 alternative: Any) -> None:
    asked: list[int] = []
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: TritonPlan("mma", 128, 16, split=2, operand=0))
    monkeypatch.setattr(launch, "gated_plan_of", lambda m, w, device: asked.append(m) or alternative)
    w = _weights()
    x = torch.randn(3, 512, dtype=torch.bfloat16)
    for _ in range(2):
        assert launch.gated_linear(x, w).shape == (3, 256)
    assert asked == [3]  # looked up once: the twin is kept with the call's bucket
    (gated,) = recorded  # the table's gated plan, ending gated; the Triton plan's launch never ran
    assert gated.constexprs["GATED"] and len(gated.calls) == 2
    assert launch.bucket_of(x, w, 3).gated.plan == alternative


def test_a_gated_plan_that_cannot_end_gated_is_not_taken(recorded: list[Recorder],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: TritonPlan("mma", 128, 16, split=2, operand=0))
    monkeypatch.setattr(launch, "gated_plan_of", lambda m, w, device: Plan(2, 64, 4, 1, in_flight=True))
    w = _weights()
    assert launch.gated_linear(torch.randn(3, 512, dtype=torch.bfloat16), w).shape == (3, 256)
    assert launch.bucket_of(torch.randn(3, 512, dtype=torch.bfloat16), w, 3).gated is False


def test_a_call_being_captured_takes_the_two_launches(recorded: list[Recorder],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: DecodePlan(1))
    kernel, w = HopperWgmmaGPTQ(FMT, "cpu"), _weights()
    x = torch.randn(2, 512, dtype=torch.bfloat16)
    assert kernel.gated(x, w, "gelu") is None  # the kernel's end is SiLU's
    assert kernel.gated(x, w, "silu").shape == (2, 256)
    plain, gated = recorded
    assert (len(plain.calls), len(gated.calls)) == (0, 1)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # as a CUDA tensor asks
    assert kernel.gated(x, w, "silu").shape == (2, 256)
    assert (len(plain.calls), len(gated.calls)) == (1, 1)


def _one_launch(kernel: Any) -> Any:
    """``kernel``'s twin whose gated call answers a marked tensor: which route a call took."""

    def gated(self: Any, x: torch.Tensor, prepared: Any, activation: str) -> torch.Tensor:
        return torch.full((*x.shape[:-1], 7), 42.0)

    return type("OneLaunch", (type(kernel),), {"gated": gated})(kernel.fmt, kernel.device)


def test_quant_linear_gated_routes_by_the_direct_route_and_hooks() -> None:
    from quantcore.nn.linear import QuantLinear

    fmt = GPTQ(bits=4, group_size=32)
    layer = QuantLinear(fmt, fmt.quantize(torch.randn(64, 64, generator=torch.Generator().manual_seed(1))),
                        dtype=torch.float32)
    x = torch.randn(3, 64)
    assert torch.equal(layer.gated(x), gated_activation(layer(x), "silu"))  # a CPU kernel ends no call gated
    assert layer.kernel is not None and layer.kernel.gated(x, layer.prepared, "silu") is None
    layer._direct = _one_launch(layer.kernel)
    assert (layer.gated(x) == 42).all()
    handle = layer.register_forward_hook(lambda module, args, out: None)
    assert torch.equal(layer.gated(x), gated_activation(layer(x), "silu"))  # a hook runs: the module's call
    handle.remove()
    assert (layer.gated(x) == 42).all()


GATED_SCRIPT = """
import json, torch
from triton.runtime.jit import mangle_type
from quantcore.backends.hopper_wgmma.decode import compile_report
from quantcore.backends.hopper_wgmma.kernels import wgmma_kernel
from quantcore.backends.hopper_wgmma.launch import kernel_args, prepare_x
from quantcore.backends.hopper_wgmma.plans import Plan
from quantcore.triton.compile_report import compile_sm90, instructions
from tools.probes.hopper_wgmma_sass import _weights
from tools.probes.hopper_wgmma_hazards import operand_hazards
for rows in (8, 16):
    r = compile_report(gated=True, rows=rows)
    print(json.dumps({"kernel": "decode", "rows": rows, "spill_stack": r["spill_stack"], "atomics": r["end"]["ATOMG"],
                      "global_access": sorted(r["global_access"]), "registers": r["registers"],
                      "plain_registers": compile_report(rows=rows)["registers"]}))
for plan in (Plan(1, 16, 4, 4), Plan(2, 16, 6, 1, in_flight=True, ws=True), Plan(1, 16, 4, 2, in_flight=True)):
    w = _weights(4, 1024, 1024, 128, True)
    x = prepare_x(torch.zeros(16, 1024, dtype=torch.bfloat16))
    _, args, const = kernel_args(x, w, plan, torch.zeros(16, 512, dtype=torch.bfloat16), torch.zeros(4),
                                 torch.zeros(4, dtype=torch.int32))
    const["GATED"] = True
    warps = const.pop("num_warps")
    names = [a for a in wgmma_kernel.arg_names if a not in const]
    # as a launch specialises them: tensors 16-byte aligned, integers that are multiples of 16
    aligned = [n for n, a in zip(names, args) if isinstance(a, torch.Tensor)
               or (type(a) is int and a % 16 == 0 and n != "M")]
    c = compile_sm90(wgmma_kernel, {n: mangle_type(a) for n, a in zip(names, args)}, const, divisible=aligned,
                     options={"num_warps": warps}, gluon=True)
    print(json.dumps({"kernel": "wgmma", "bm": plan.bm, "spill_stack": c.spill_stack,
                      "hazards": len(operand_hazards(c.sass)),
                      "global_access": sorted({i.opcode for i in instructions(c.sass) if i.opcode.startswith(("LDG", "STG"))})}))
"""


@needs_gluon_release
@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_the_kernels_compile_gated_for_sm90_without_spills() -> None:
    rows = compiled_rows(GATED_SCRIPT)
    assert [r["kernel"] for r in rows] == ["decode"] * 2 + ["wgmma"] * 3
    for r in rows:
        assert r["spill_stack"] == 0, r
        assert r.get("hazards", 0) == 0, r
        assert r.get("atomics", 2) == 2, r  # the pair's ticket and its reset
        # The pair's workspace reads (from L2: .STRONG.GPU) and its output stores 16 bytes
        # at a time: I's alignment is known to the compiler, else each goes a scalar at a time.
        ends = [op for op in r["global_access"] if op.startswith("STG") or "STRONG" in op]
        assert ends and all(".128" in op for op in ends), r
        if r["kernel"] == "decode":  # registers go to a warp 8 a thread at a time: as many programs an SM
            assert -(-r["registers"] // 8) <= -(-r["plain_registers"] // 8), r


def test_a_gated_call_checks_x_as_the_layers_call_does(recorded: list[Recorder],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.errors import KernelInputError

    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: DecodePlan(1))
    kernel, w = HopperWgmmaGPTQ(FMT, "cpu"), _weights()
    for bad, what in ((torch.randn(2, 384, dtype=torch.bfloat16), "384"),
                      (torch.randn(2, 512, dtype=torch.float32), "float32"),
                      (torch.randn(2, 512, dtype=torch.bfloat16, device="meta"), "meta"),
                      ("rows", "str")):
        with pytest.raises(KernelInputError, match=rf"\bx\b.*{what}"):
            kernel.gated(bad, w, "silu")  # type: ignore[arg-type]
    with pytest.raises(KernelInputError, match="prepared"):
        kernel.gated(torch.randn(2, 512, dtype=torch.bfloat16), object(), "silu")
    assert not recorded  # nothing was bound, nothing launched
    strided = torch.randn(512, 4, dtype=torch.bfloat16).t()[:2]  # x's rows 4 elements apart
    assert kernel.gated(strided, w, "silu").shape == (2, 256)  # made contiguous, as the layer's call does
