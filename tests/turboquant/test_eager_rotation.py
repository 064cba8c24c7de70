"""Where an eager call of the tensor-core kernel gets x rotated: inside its one launch
(``once``) while the work is small, by the GEMM before the launch when the GPU bounds the
call or the call is being recorded into a CUDA graph (``configs.mma_rotation``,
``EAGER_ONCE_MAX_MACS``); and the eager plan computes what the graph's plan computes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.ops.linear import linear_reference

from ..interpreting import INTERPRETER, NOT_INTERPRETED
from .test_triton_mma_rotate_once import _signed_permutation, _with_rotations
from .test_triton_mma_rotation import D, K, N, _dequantized, _layer


@pytest.fixture(autouse=True)
def _no_forced_rotation(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.backends.turboquant_triton.configs import ROTATION_ENV

    monkeypatch.delenv(ROTATION_ENV, raising=False)


def test_the_rule() -> None:
    from quantcore.backends.turboquant_triton.configs import (
        EAGER_ONCE_MAX_MACS,
        MmaConfig,
        mma_rotation,
    )

    open_cfg = MmaConfig()
    assert mma_rotation(open_cfg) == "outside"  # recorded into a graph, or host cost no concern
    assert mma_rotation(open_cfg, eager_macs=EAGER_ONCE_MAX_MACS) == "once"
    assert mma_rotation(open_cfg, eager_macs=EAGER_ONCE_MAX_MACS + 1) == "outside"
    # Where one rotation cannot go inside, an eager call keeps it outside too.
    assert mma_rotation(open_cfg, eager_macs=1, rotation_per_group=True) == "outside"
    assert mma_rotation(open_cfg, eager_macs=1, fp32_operands=True) == "outside"
    assert mma_rotation(open_cfg, eager_macs=1, wide_group=True) == "outside"  # Π of d = 256: 128 KB
    assert mma_rotation(MmaConfig(rotate_in_kernel=True), eager_macs=1, wide_group=True) == "outside"
    # A tile wider than 64 rows of x spills with the rotation beside it (configs.ROTATION_MAX_BLOCK_M).
    for wide in (MmaConfig(block_m=128), MmaConfig(block_m=128, rotate_in_kernel=True),
                 MmaConfig(block_m=128, rotate_once=True)):
        assert mma_rotation(wide, eager_macs=1) == "outside", wide
    assert mma_rotation(MmaConfig(block_m=64, rotate_once=True)) == "once"
    # A config that names the place keeps it.
    assert mma_rotation(MmaConfig(rotate_in_kernel=False), eager_macs=1) == "outside"
    assert mma_rotation(MmaConfig(rotate_in_kernel=True), eager_macs=1) == "kernel"


def test_the_environment_still_has_the_last_word(monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.backends.turboquant_triton.configs import ROTATION_ENV, MmaConfig, mma_rotation

    monkeypatch.setenv(ROTATION_ENV, "outside")
    assert mma_rotation(MmaConfig(), eager_macs=1) == "outside"


def test_the_work_is_counted_at_the_top_of_the_m_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every M of one bucket gets one plan: M = 33 … 64 of 4096×14336 count as M = 64
    (3.8 G multiply-adds: once), M = 65 … 128 as M = 128 (7.5 G: outside)."""
    from quantcore.backends.turboquant_triton import configs

    work = {m: configs.m_bucket(m) * 4096 * 14336 for m in (33, 64, 65, 128)}
    assert [configs.mma_rotation(configs.MmaConfig(), eager_macs=w) for w in work.values()] == [
        "once", "once", "outside", "outside"]


def test_eager_calls_take_one_launch_and_leave_the_recorded_plan_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planned as on a GPU (launches recorded, not run). The first eager call at an M runs
    the plan a CUDA-graph recording takes (the GEMM outside: made and compiled now, since a
    recording cannot compile) and then its own (x rotated in its one launch); later eager
    calls at that M run only their own; a recording at that M makes nothing new."""
    from quantcore.backends.turboquant_triton import fused
    from tests.launch_recorder import record_launches

    recorded = record_launches(monkeypatch, fused)
    monkeypatch.setattr(fused, "interpreting", lambda: False)
    _, _, prep = _layer("own-rotations")
    passes = tuple(dataclasses.replace(p, rotation=p.rotation.to(torch.bfloat16)) for p in prep.passes)  # a GPU's
    launched: list[bool] = []  # ROTATE_ONCE of each launch, in order

    def call(m: int, eager: bool) -> None:
        monkeypatch.setattr(fused, "_eager", lambda device: eager)
        calls = {id(r): len(r.calls) for r in recorded}
        fused.fused_linear(torch.randn(m, K).to(torch.bfloat16), passes, prep.codebook, group_size=D, partial=None,
                           bias=None, out_dtype=torch.bfloat16, path="mma")
        launched[:] = [r.constexprs["ROTATE_ONCE"] for r in recorded for _ in range(len(r.calls) - calls.get(id(r), 0))]

    call(16, eager=True)
    assert sorted(launched) == [False, True]  # the recorded plan warmed, then the eager one
    call(16, eager=True)
    assert launched == [True]
    made = len(recorded)
    call(16, eager=False)  # a recording at a warmed M
    assert launched == [False] and len(recorded) == made
    call(12, eager=True)  # another M of the same bucket: warmed again (its split may differ)
    assert sorted(launched) == [False, True]


def test_off_the_gpu_nothing_changes() -> None:
    from quantcore.backends.turboquant_triton.fused import _eager

    assert _eager(torch.device("cpu")) is False


@pytest.mark.skipif(not INTERPRETER, reason=NOT_INTERPRETED)
@pytest.mark.parametrize("name", ["one-pass", "own-rotations"])
def test_the_eager_plan_computes_the_recorded_plans_bits(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Under the interpreter, with rotations exact in any order (signed permutations): the
    eager bucket's output is the recorded bucket's, bit for bit, and meets the golden."""
    from quantcore.backends.turboquant_triton import fused

    fmt, t, prep = _layer(name, seed=7)
    gen = torch.Generator().manual_seed(8)
    pis = [_signed_permutation(gen) for _ in fmt.passes]
    rotated = _with_rotations(prep, fmt, pis, torch.bfloat16)
    x = torch.randn(16, K, generator=gen).to(torch.bfloat16)
    outs = {}
    for eager in (True, False):
        monkeypatch.setattr(fused, "_eager", lambda device, e=eager: e)
        outs[eager] = fused.fused_linear(x, rotated.passes, rotated.codebook, group_size=D, partial=None,
                                         bias=rotated.bias, out_dtype=torch.float32, path="mma")
    from quantcore.triton.launch import launch_state

    kept = [b for b in launch_state(rotated.codebook).values() if isinstance(b, fused._Mma)]
    assert sorted(b.once for b in kept) == [False, True]  # the two calls ran two plans
    assert torch.equal(outs[True], outs[False])
    ref = linear_reference(x, _dequantized(fmt, t, pis), t["bias"])
    result = compare(outs[True].to(torch.bfloat16), ref, tolerance_for(torch.bfloat16))
    assert result.ok, result.problem
    assert outs[True].shape == (16, N)


@pytest.mark.skipif(not INTERPRETER, reason=NOT_INTERPRETED)
@pytest.mark.parametrize("group_size", [128, 256])
def test_wide_groups_keep_the_rotation_outside_an_eager_launch(monkeypatch: pytest.MonkeyPatch,
                                                               group_size: int) -> None:
    """An eager call of small work rotates x once inside its launch, unless its groups are
    wider than 128 columns (Π of d = 256 is 128 KB of shared memory: the tile beside it
    does not fit a GPU); the answer is the golden's either way."""
    from quantcore.backends.turboquant_triton import TurboQuantTriton, fused
    from quantcore.formats.turboquant import TurboQuant

    monkeypatch.setattr(fused, "_eager", lambda device: True)
    fmt = TurboQuant(group_size=group_size)
    gen = torch.Generator().manual_seed(group_size + 1)
    t = fmt.quantize(torch.randn(48, 2 * group_size, generator=gen) * 0.05, generator=gen)
    prep = TurboQuantTriton(fmt, "cpu").prepare(t)
    passes = tuple(dataclasses.replace(p, rotation=p.rotation.to(torch.bfloat16)) for p in prep.passes)  # a GPU's
    x = torch.randn(16, 2 * group_size, generator=gen).to(torch.bfloat16)
    y = fused.fused_linear(x, passes, prep.codebook, group_size=group_size, partial=None, bias=None,
                           out_dtype=torch.bfloat16, path="mma")
    from quantcore.triton.launch import launch_state

    eager = [b for b in launch_state(prep.codebook).values() if isinstance(b, fused._Mma) and b.rotation != "outside"]
    assert bool(eager) is (group_size == 128)
    result = compare(y, linear_reference(x, fmt.dequantize(t), None), tolerance_for(torch.bfloat16))
    assert result.ok, result.problem
