"""A TurboQuant layer's rotation in the code matrix's launch (``rotation_programs.py``),
checked without a GPU: an eager call of up to 128 rows is one launch of the decode or the
wgmma kernel (the layer's x, the rotation, the kept workspace and counts, the rotation
programs' rows in front of the grid); a call being captured, more rows, and the probe's
``"never"`` take the rotation's launch and the code matrix's; the rotating twin is bound once
per bucket and again for replaced rotations; both kernels compile rotating for sm_90a
without spills or operand hazards. The bits (equal to the two launches') are checked on a
GPU (``test_turboquant_cuda.py``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from quantcore.backends.hopper_wgmma import decode_bucket, launch, turboquant_launch
from quantcore.backends.hopper_wgmma.plans import DecodePlan, Plan
from quantcore.backends.hopper_wgmma.rotation_programs import rotation_chunks
from quantcore.backends.hopper_wgmma.turboquant import HopperWgmmaTurboQuant
from quantcore.formats.turboquant import TurboQuant
from quantcore.kernels.turboquant import rotation_launch
from tests.launch_recorder import Recorder, assert_fixed_arguments_specialise_alike, record_launches
from tests.triton_release import needs_gluon_release

from .test_sm90_compile import _bundled_tools, compiled_rows

K, N = 512, 1024


def _weights(fmt: TurboQuant) -> Any:
    gen = torch.Generator().manual_seed(5)
    stored = fmt.quantize(torch.randn(N, K, generator=gen) * 0.02, generator=gen)
    return HopperWgmmaTurboQuant(fmt, "cpu").prepare(stored, dtype=torch.bfloat16)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    monkeypatch.delenv(launch.PDL_ENV, raising=False)
    record_launches(monkeypatch, launch)
    record_launches(monkeypatch, rotation_launch)
    return record_launches(monkeypatch, decode_bucket)  # one list: every module's launches, in order


def _plan(monkeypatch: pytest.MonkeyPatch, plan: Any) -> None:
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plan)


@pytest.mark.parametrize("fmt", [TurboQuant(), TurboQuant(residual=True), TurboQuant(rotation_per_group=True)],
                         ids=lambda f: f.slug)
@pytest.mark.parametrize("m", [1, 8])
def test_an_eager_decode_call_is_one_launch(recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch,
                                            fmt: TurboQuant, m: int) -> None:
    _plan(monkeypatch, DecodePlan(split=2))
    w = _weights(fmt)
    x = torch.randn(m, K, dtype=torch.bfloat16)
    y = turboquant_launch.turboquant_linear(x, w)
    assert y.shape == (m, N) and y.dtype == torch.bfloat16
    called = [r for r in recorded if r.calls]
    assert len(called) == 1, "one launch: no rotation launch, no plain code-matrix launch"
    (grid, args), = called[0].calls
    const = called[0].constexprs
    passes, groups = len(fmt.passes), K // 128
    assert const["ROTATE"] and const["RD"] == 128 and const["RCOLS"] == passes * 128
    assert const["RSHARED"] is not fmt.rotation_per_group
    tiles, split = N // 64, 2
    rows = -(-rotation_chunks(m, groups) // tiles)
    assert grid == (tiles, rows + split, 1) and args[19] == rows and args[15] == split
    assert args[16] is x, "the rotation programs read the layer's x"
    xr, rhs, counts = args[1], args[17], args[18]
    assert xr is not x and xr.dtype == torch.bfloat16 and xr.numel() >= m * passes * K
    assert args[10] == args[11] == passes * K, "the code matrix reads the rotated x at its own depth"
    assert rhs.dtype == torch.bfloat16 and rhs.shape[-2:] == (128, passes * 128)
    assert counts.dtype == torch.int32 and counts.numel() >= 2 and not counts[:2].any()
    turboquant_launch.turboquant_linear(x, w)
    assert len(called[0].calls) == 2 and len([r for r in recorded if r.calls]) == 1, "the twin is kept"
    assert_fixed_arguments_specialise_alike([called[0]])


@pytest.mark.parametrize("fmt", [TurboQuant(), TurboQuant(residual=True), TurboQuant(rotation_per_group=True)],
                         ids=lambda f: f.slug)
def test_direct_loads_hand_the_kernel_the_rotations_transpose(recorded: list[Recorder],
                                                             monkeypatch: pytest.MonkeyPatch, fmt: TurboQuant) -> None:
    _plan(monkeypatch, DecodePlan(split=2))
    monkeypatch.setattr(turboquant_launch, "ROTATION_DIRECT_LOADS", True)
    w = _weights(fmt)
    x = torch.randn(3, K, dtype=torch.bfloat16)
    turboquant_launch.turboquant_linear(x, w)
    turboquant_launch.turboquant_linear(x, w)
    called = [r for r in recorded if r.calls]
    assert len(called) == 1 and len(called[0].calls) == 2, "one launch a call, the twin kept"
    assert called[0].constexprs["RDIRECT"]
    operand = called[0].calls[0][1][17]
    rhs = turboquant_launch.layer_rotation(w, torch.bfloat16, torch.device("cpu")).rhs
    assert operand.is_contiguous() and torch.equal(operand, rhs.transpose(-1, -2))
    assert called[0].calls[1][1][17] is operand


def test_a_rotation_per_group_reads_each_groups_own() -> None:
    w = _weights(TurboQuant(rotation_per_group=True))
    rotation = turboquant_launch.layer_rotation(w, torch.bfloat16, torch.device("cpu"))
    assert rotation.rhs.shape == (K // 128, 128, 128) and not rotation.rotation.shared


@pytest.mark.parametrize("fmt", [TurboQuant(), TurboQuant(residual=True)], ids=lambda f: f.slug)
@pytest.mark.parametrize(("plan", "m"), [(Plan(1, 16, 4, 2, in_flight=True), 16),
                                         (Plan(2, 64, 4, 1, in_flight=True, ws=True), 100)], ids=["wgmma", "ws"])
def test_an_eager_wgmma_call_is_one_launch(recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch,
                                           fmt: TurboQuant, plan: Plan, m: int) -> None:
    _plan(monkeypatch, plan)
    w = _weights(fmt)
    x = torch.randn(m, K, dtype=torch.bfloat16)
    y = turboquant_launch.turboquant_linear(x, w)
    assert y.shape == (m, N)
    called = [r for r in recorded if r.calls]
    assert len(called) == 1
    (grid, args), = called[0].calls
    passes = len(fmt.passes)
    assert called[0].constexprs["ROTATE"] and called[0].constexprs["RCOLS"] == passes * 128
    tiles = -(-N // (64 * plan.wg)) * -(-m // plan.bm)
    rows = -(-rotation_chunks(m, K // 128) // tiles)
    assert grid == (tiles, rows + plan.split, 1) and args[19] == rows
    x_desc, xr = args[1], args[17]
    assert args[15] is x and x_desc.base is xr and xr is not x
    assert x_desc.shape == [passes * K // 32, m, 32] and xr.numel() >= m * passes * K
    assert args[18].dtype == torch.int32 and args[16].shape[-1] == passes * 128


@pytest.mark.parametrize("why", ["captured", "rows", "never"])
def test_other_calls_take_the_rotations_launch_and_the_code_matrix(recorded: list[Recorder],
                                                                  monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    _plan(monkeypatch, Plan(1, 64, 4, 2, in_flight=True) if why == "rows" else DecodePlan(split=2))
    if why == "captured":
        monkeypatch.setattr(turboquant_launch, "capturing", lambda x: True)
    if why == "never":
        monkeypatch.setattr(turboquant_launch, "ROTATION_IN_LAUNCH", "never")
    if why == "rows":  # two 16-row chunks of the weight's 4 blocks: 8 (chunk, block) pairs, over twice 3
        monkeypatch.setattr(turboquant_launch, "ROTATION_MAX_BLOCKS", 3)
    w = _weights(TurboQuant())
    x = torch.randn(17 if why == "rows" else 4, K, dtype=torch.bfloat16)
    turboquant_launch.turboquant_linear(x, w)
    called = [r for r in recorded if r.calls]
    assert len(called) == 2
    rotation, code_matrix = called
    assert rotation.fn is rotation_launch.rotate_rows_kernel
    assert not code_matrix.constexprs.get("ROTATE", False)


@pytest.mark.parametrize(("k", "n", "passes", "m", "fused"), [
    (4096, 14336, 1, 64, True), (4096, 14336, 2, 16, True), (4096, 14336, 2, 64, False),
    (14336, 4096, 1, 16, True), (14336, 4096, 1, 64, False), (14336, 4096, 2, 16, False),
    (4096, 4096, 1, 64, True), (4096, 4096, 1, 128, True), (4096, 4096, 2, 64, True), (4096, 4096, 2, 128, False),
    (8192, 28672, 1, 1, False)])
def test_the_calls_that_rotate_in_their_launch(k: int, n: int, passes: int, m: int, fused: bool) -> None:
    """turboquant_launch's bounds on the shapes the H200 measured: a small weight and little
    rotation work take the one launch (a smaller weight more work); more rows of a long K, or
    a large weight, do not."""
    w = SimpleNamespace(in_features=passes * k, out_features=n)
    assert turboquant_launch.rotates_in_launch(m, w) is fused  # type: ignore[arg-type]


def test_replaced_rotations_bind_a_new_twin(recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch) -> None:
    _plan(monkeypatch, DecodePlan(split=2))
    w = _weights(TurboQuant())
    x = torch.randn(1, K, dtype=torch.bfloat16)
    turboquant_launch.turboquant_linear(x, w)
    first = [r for r in recorded if r.calls][-1].calls[-1][1][17]
    with torch.no_grad():
        w.rotations[0].mul_(-1.0)  # in place: its version moves on
    turboquant_launch.turboquant_linear(x, w)
    rhs = [r for r in recorded if r.calls][-1].calls[-1][1][17]
    assert rhs is not first and torch.equal(rhs, -first)


def test_a_float32_call_has_no_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    _plan(monkeypatch, DecodePlan(split=2))
    w = _weights(TurboQuant())
    bucket = decode_bucket.DecodeBucket(w, torch.float32, torch.device("cpu"), DecodePlan(split=2))
    rotation = turboquant_launch.layer_rotation(w, torch.float32, torch.device("cpu"))
    assert turboquant_launch._rotating(bucket, w, rotation) is None and bucket.rotated is False


ROTATE_SCRIPT = """
import json, torch
from triton.runtime.jit import mangle_type
from quantcore.backends.hopper_wgmma.decode import compile_report
from quantcore.backends.hopper_wgmma.kernels import wgmma_kernel
from quantcore.backends.hopper_wgmma.launch import kernel_args, prepare_x
from quantcore.backends.hopper_wgmma.plans import Plan
from quantcore.triton.compile_report import compile_sm90
from tools.probes.hopper_wgmma_sass import _weights
from tools.probes.hopper_wgmma_hazards import operand_hazards
for rows, cols, direct in ((8, 128, False), (8, 256, False), (16, 256, False), (8, 256, True), (16, 256, True)):
    r = compile_report(lookup=True, rows=rows, rotate=cols, direct=direct)
    print(json.dumps({"kernel": "decode", "cols": cols, "direct": direct, "spill_stack": r["spill_stack"],
                      "shared": r["shared"], "registers": r["registers"], "plain_registers": compile_report(lookup=True, rows=rows)["registers"]}))
for plan, cols in ((Plan(1, 16, 4, 4, in_flight=True), 256), (Plan(2, 64, 4, 1, in_flight=True, ws=True), 256),
                   (Plan(1, 64, 4, 2, in_flight=True), 128)):
    w = _weights(4, 1024, 1024, 128, True)
    x = prepare_x(torch.zeros(16, 1024, dtype=torch.bfloat16))
    _, args, const = kernel_args(x, w, plan, torch.zeros(16, 1024, dtype=torch.bfloat16), torch.zeros(4),
                                 torch.zeros(4, dtype=torch.int32))
    const.update(LOOKUP=True, HAS_ZEROS=False, HAS_BIAS=False, LATE=False)
    warps = const.pop("num_warps")
    names = [a for a in wgmma_kernel.arg_names if a not in const]
    aligned = [n for n, a in zip(names, args) if isinstance(a, torch.Tensor)
               or (type(a) is int and a % 16 == 0 and n not in ("M", "rot_rows"))]
    sig = {n: mangle_type(a) for n, a in zip(names, args)}
    sig.update(b_ptr="*fp32", rx_ptr="*bf16", rot_ptr="*bf16", xr_ptr="*bf16", sync_ptr="*i32")
    found = [compile_sm90(wgmma_kernel, sig, dict(const, ROTATE=rotate, RCOLS=cols, RDIRECT=direct), divisible=aligned,
                          options={"num_warps": warps}, gluon=True) for rotate, direct in ((False, False), (True, False), (True, True))]
    for c, direct in zip(found[1:], (False, True)):
        print(json.dumps({"kernel": "wgmma", "cols": cols, "direct": direct, "spill_stack": c.spill_stack,
                          "shared": c.shared, "registers": c.registers, "plain_registers": found[0].registers,
                          "hazards": len(operand_hazards(c.sass))}))
"""


@needs_gluon_release
@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_the_kernels_compile_rotating_for_sm90_without_spills() -> None:
    rows = compiled_rows(ROTATE_SCRIPT)
    assert [r["kernel"] for r in rows] == ["decode"] * 5 + ["wgmma"] * 6
    for r in rows:
        assert r["spill_stack"] == 0 and r.get("hazards", 0) == 0, r
        assert r["shared"] <= 227 * 1024, r
        if r["kernel"] == "decode" and not r["direct"]:
            # The rotation programs' branch sets the kernel's registers: 80 against the plain
            # kernel's 53-56 (Triton 3.6); more would cost the code matrix programs an SM.
            assert r["registers"] <= 80, r
        elif r["kernel"] == "decode":  # loaded straight into registers: no more than 8 over the plain kernel
            assert r["registers"] <= r["plain_registers"] + 8, r
        else:  # the wgmma kernel's own tiles need more than the rotation: no register more
            assert r["registers"] <= r["plain_registers"] + 1, r
