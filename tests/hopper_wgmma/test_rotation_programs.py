"""A TurboQuant layer's rotation in the decode kernel's launch (``rotation_programs.py``),
checked without a GPU: an eager call of a decode plan is one launch (the layer's x, the
rotation, the kept workspace and counts, the rotation programs' rows in front of the grid);
a call being captured, a wgmma plan, and the probe's ``"never"`` take the rotation's launch
and the code matrix's; the rotating twin is bound once per bucket and again for replaced
rotations; the kernel compiles for sm_90a without spills. The bits (equal to the two
launches') are checked on a GPU (``test_turboquant_cuda.py``)."""

from __future__ import annotations

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


def test_a_rotation_per_group_reads_each_groups_own() -> None:
    w = _weights(TurboQuant(rotation_per_group=True))
    rotation = turboquant_launch.layer_rotation(w, torch.bfloat16, torch.device("cpu"))
    assert rotation.rhs.shape == (K // 128, 128, 128) and not rotation.rotation.shared


@pytest.mark.parametrize("why", ["captured", "wgmma", "never"])
def test_other_calls_take_the_rotations_launch_and_the_code_matrix(recorded: list[Recorder],
                                                                  monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    _plan(monkeypatch, Plan(1, 16, 4, 2, in_flight=True) if why == "wgmma" else DecodePlan(split=2))
    if why == "captured":
        monkeypatch.setattr(turboquant_launch, "capturing", lambda x: True)
    if why == "never":
        monkeypatch.setattr(turboquant_launch, "ROTATION_IN_LAUNCH", "never")
    w = _weights(TurboQuant())
    x = torch.randn(4, K, dtype=torch.bfloat16)
    turboquant_launch.turboquant_linear(x, w)
    called = [r for r in recorded if r.calls]
    assert len(called) == 2
    rotation, code_matrix = called
    assert rotation.fn is rotation_launch.rotate_rows_kernel
    assert not code_matrix.constexprs.get("ROTATE", False)


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
import json
from quantcore.backends.hopper_wgmma.decode import compile_report
for rows, cols in ((8, 128), (8, 256), (16, 256)):
    r = compile_report(lookup=True, rows=rows, rotate=cols)
    print(json.dumps({"rows": rows, "cols": cols, "spill_stack": r["spill_stack"], "shared": r["shared"],
                      "registers": r["registers"], "atomics": r["end"]["ATOMG"]}))
"""


@needs_gluon_release
@pytest.mark.skipif(not _bundled_tools(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
def test_the_decode_kernel_compiles_rotating_for_sm90_without_spills() -> None:
    rows = compiled_rows(ROTATE_SCRIPT)
    assert len(rows) == 3
    for r in rows:
        assert r["spill_stack"] == 0, r
        assert r["shared"] <= 227 * 1024, r
        # The rotation programs' branch sets the kernel's registers: 80 against the plain
        # kernel's 53 (compiled with Triton 3.6); more would cost the code matrix programs an SM.
        assert r["registers"] <= 80, r
