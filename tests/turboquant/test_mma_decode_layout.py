"""The ``mma.sync`` decode kernel over the shipped layout (``decode_mma.py``) on the CPU: the
k-slot permutation, the emulation of its arithmetic against the float64 golden, the launch's
argument checks, and (where Triton's bundled ptxas is present) that the variants it ships
compile for sm_90a with 128-bit index loads and no spills."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from quantcore.backends.turboquant_triton import TurboQuantTriton
from quantcore.backends.turboquant_triton import decode_mma as dm
from quantcore.formats.turboquant import TurboQuant
from quantcore.kernels.turboquant.rotation import InputRotation
from quantcore.triton.compile_report import tools_available
from tests.triton_release import needs_gluon_release

from .cuda_layers import quantized_layer


def test_slots_are_a_permutation_of_the_block() -> None:
    assert sorted(dm.slot_coordinate().reshape(-1).tolist()) == list(range(dm.BK))


def test_slot_codes_read_the_stored_nibbles_of_their_coordinates() -> None:
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 256, (5, 2 * dm.BK // 2), dtype=torch.uint8, generator=gen)
    codes = torch.stack((idx & 15, idx >> 4), -1).reshape(5, 2 * dm.BK).long()  # coordinate order
    for g in range(2):
        want = codes[:, g * dm.BK:(g + 1) * dm.BK][:, dm.slot_coordinate().reshape(-1)].view(5, 4, 32)
        assert torch.equal(dm.slot_codes(idx, g), want)


def _prepared(passes: int, k: int, n: int, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    fmt = TurboQuant(group_size=128, residual=passes == 2)
    t = quantized_layer(fmt, n, k, seed=7 * passes + k)
    return fmt, t, TurboQuantTriton(fmt, "cpu").prepare(t, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("passes", [1, 2])
def test_emulation_matches_the_golden(passes: int, dtype: torch.dtype) -> None:
    k, n, m = 384, 72, 3
    fmt, t, prep = _prepared(passes, k, n, dtype)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(3)).to(dtype)
    golden = x.double() @ fmt.dequantize(t).double().T + t["bias"].double()
    x_rot = InputRotation([d.rotation for d in prep.passes])(x.contiguous()).view(m, passes * k)
    y = dm.emulate(x_rot, prep.passes, prep.codebook, prep.bias, dtype)
    assert y.dtype == dtype and y.shape == (m, n)
    err = float((y.double() - golden).norm() / golden.norm())
    assert err < (1e-2 if dtype == torch.bfloat16 else 2e-3), err


@pytest.mark.parametrize(("blocks", "split", "passes"), [(32, 4, 1), (64, 8, 2), (22, 3, 2), (11, 4, 1), (2, 16, 2)])
def test_grid_covers_the_blocks_with_even_runs_for_two_passes(blocks: int, split: int, passes: int) -> None:
    steps, programs = dm.decode_grid(blocks, split, passes)
    assert steps >= 2 and (passes == 1 or steps % 2 == 0)
    assert programs * steps >= blocks > (programs - 1) * steps


def test_launch_checks_its_arguments() -> None:
    _, _, prep = _prepared(2, 256, 64, torch.bfloat16)
    x_rot = torch.zeros(3, 512, dtype=torch.bfloat16)
    out = torch.empty(3, 64, dtype=torch.bfloat16)
    call = dict(split=4, tiles=2, copies=32)
    with pytest.raises(ValueError, match="rows"):
        dm.mma_decode(torch.zeros(9, 512, dtype=torch.bfloat16), prep.passes, prep.codebook, None,
                      torch.empty(9, 64, dtype=torch.bfloat16), **call)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="x_rot"):
        dm.mma_decode(x_rot[:, :256], prep.passes, prep.codebook, None, out, **call)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bf16 or fp16"):
        dm.mma_decode(x_rot, prep.passes, prep.codebook, None, out.float(), **call)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tiles"):
        dm.mma_decode(x_rot, prep.passes, prep.codebook, None, out, split=4, tiles=4, copies=32)
    with pytest.raises(ValueError, match="workspace"):
        dm.mma_decode(x_rot, prep.passes, prep.codebook, None, out, split=2, tiles=2, copies=32)
    with pytest.raises(ValueError, match="counters"):
        dm.mma_decode(x_rot, prep.passes, prep.codebook, None, out, split=2, tiles=2, copies=32,
                      workspace=torch.empty(dm.workspace_size(3, 64, 2)))
    assert dm.counters_size(1000, 2) == 8 and dm.workspace_size(3, 64, 1) == 0


#: The variants ``(fp16, passes, tiles, copies)`` the backend ships.
SHIPPED = [(f, p, t, c) for f in (False, True) for p in (1, 2) for t, c in ((2, 32), (1, 16))]

_SCRIPT = """
import json, sys
from quantcore.backends.turboquant_triton.decode_mma import compile_report
for f, p, t, c in json.loads(sys.argv[1]):
    print(json.dumps(compile_report(fp16=f, passes=p, tiles=t, copies=c)))
"""


@pytest.mark.skipif(not tools_available(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
@needs_gluon_release
def test_shipped_variants_compile_without_spills() -> None:
    env = {a: v for a, v in os.environ.items() if a != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(SHIPPED)], capture_output=True, text=True,
                         env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(SHIPPED)
    for r in rows:
        walk = r["walk"]
        assert r["spill_stack"] == 0 and r["registers"] <= 80, r
        # Two steps a trip, four slices a step, two m16n8k16 a slice; one table load a pair.
        assert walk["HMMA"] == 16 and r["lds_per_weight"] == 0.5, walk
        assert walk["LDSM"] > 0 and not {"STS", "STL", "LDL", "BAR"} & set(walk), walk
        assert r["per_weight"] < 2.5, r


def test_staged_order_is_the_slot_order() -> None:
    assert torch.equal(dm.staged_slot_coordinate(), dm.slot_coordinate())


@pytest.mark.parametrize("passes", [1, 2])
def test_wide_slot_codes_read_both_groups_of_the_line(passes: int) -> None:
    gen = torch.Generator().manual_seed(2)
    idx = torch.randint(0, 256, (5, 3 * dm.BK // 2), dtype=torch.uint8, generator=gen)  # 3 groups: a tail
    assert dm.wide_units(3, passes) == 2 * passes
    for unit in range(dm.wide_units(3, passes)):
        g0 = 2 * (unit // passes)
        got = dm.wide_slot_codes(idx, unit, passes)
        assert torch.equal(got[:, 0], dm.slot_codes(idx, g0))
        assert torch.equal(got[:, 1], dm.slot_codes(idx, min(g0 + 1, 2)))


@pytest.mark.parametrize(("wide", "xvec"), [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize(("passes", "k"), [(1, 384), (2, 384), (2, 512)])
def test_option_emulation_matches_the_golden(passes: int, k: int, wide: bool, xvec: bool) -> None:
    dtype = torch.bfloat16
    n, m = 72, 3
    fmt, t, prep = _prepared(passes, k, n, dtype)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(3)).to(dtype)
    golden = x.double() @ fmt.dequantize(t).double().T + t["bias"].double()
    x_rot = InputRotation([d.rotation for d in prep.passes])(x.contiguous()).view(m, passes * k)
    y = dm.emulate(x_rot, prep.passes, prep.codebook, prep.bias, dtype, wide=wide, xvec=xvec)
    base = dm.emulate(x_rot, prep.passes, prep.codebook, prep.bias, dtype)
    assert y.dtype == dtype and y.shape == (m, n)
    err = float((y.double() - golden).norm() / golden.norm())
    assert err < 1e-2, err
    assert float((y.double() - base.double()).norm() / golden.norm()) < 1e-2


#: The options ``(passes, tiles, copies, wide, xvec, steps)`` at the shipped variants' groups a program.
OPTIONS = [(p, t, c, w, v, 4 if w else 8) for p in (1, 2) for t, c in ((2, 32), (1, 16))
           for w, v in ((True, False), (False, True), (True, True))]

_OPTIONS_SCRIPT = """
import json, sys
from quantcore.backends.turboquant_triton.decode_mma import compile_report
for p, t, c, w, v, s in json.loads(sys.argv[1]):
    print(json.dumps(compile_report(passes=p, tiles=t, copies=c, wide=w, xvec=v, steps=s)))
"""


@pytest.mark.skipif(not tools_available(), reason="triton with its NVIDIA tools (ptxas, cuobjdump) not installed")
@needs_gluon_release
def test_options_compile_without_spills() -> None:
    env = {a: v for a, v in os.environ.items() if a != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _OPTIONS_SCRIPT, json.dumps(OPTIONS)], capture_output=True,
                         text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(OPTIONS)
    for r in rows:
        assert r["spill_stack"] == 0, r
        assert r["lds_per_weight"] == 0.5 and not {"STL", "LDL", "BAR"} & set(r["walk"]), r
        if r["xvec"]:  # x read in 16-byte runs, each slice's eight k-slots one 16-byte store
            assert r["staging"].get("LDG.E.128", 0) > 0 and "LDG.E.U16" not in r["staging"], r


def test_xvec_refuses_a_run_that_is_not_a_power_of_two() -> None:
    from quantcore.backends.turboquant_triton.decode_mma import launch_constants

    split, const = launch_constants(1, 8, 1, tiles=1, copies=16, has_bias=False, xvec=True)
    assert (split, const["STEPS"], const["XVEC"]) == (1, 8, True)
    with pytest.raises(ValueError, match="power of two steps"):
        launch_constants(1, 8, 3, tiles=1, copies=16, has_bias=False, xvec=True)  # runs of 3
