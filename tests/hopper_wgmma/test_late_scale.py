"""Late-scale plans (``Plan.late_scale``), checked without a GPU: the plan's rules, what a
launch binds (the ``LATE`` constexpr only where it applies: 4-bit, one scale row per
block, the in-flight walk; a register cap as a launch option), the operand's PTX (the
exact ``B + q`` pairs, emulated bit for bit), the fold's algebra against the float
reference, and the device sweep's coverage (checked and timed as twins, shipped only
where a check ran them). The kernel itself runs on sm_90 only: ``tools/probes/hopper_wgmma_sweep.py``."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import torch

from quantcore.backends.hopper_wgmma import launch
from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.plans import Plan, plan_from_dict
from quantcore.formats.gptq import GPTQ
from quantcore.kernels.gptq_pairs.layout import field_inputs, interleave_codes
from quantcore.kernels.gptq_pairs.ptx import offset_pair_asm_text
from tests.launch_recorder import Recorder, record_launches
from tools.probes.hopper_wgmma_sweep import (
    LATE_KIND,
    LATE_MAX_BM,
    _kind,
    candidates,
    check_cases,
    late_twins,
)

LATE = Plan(1, 8, 4, 2, in_flight=True, late_scale=True)


def test_late_scale_needs_the_in_flight_walk_and_a_register_cap_is_bounded() -> None:
    with pytest.raises(ValueError, match=r"late_scale needs in_flight=True"):
        Plan(1, 8, 4, 2, late_scale=True)
    with pytest.raises(ValueError, match="out of range"):
        Plan(1, 8, 4, 2, in_flight=True, maxnreg=300)
    assert plan_from_dict(dataclasses.asdict(LATE)) == LATE
    old_row = {"wg": 1, "bm": 8, "stages": 4, "split": 2, "per_wait": 1, "in_flight": True, "ws": False}
    assert plan_from_dict(old_row).late_scale is False and plan_from_dict(old_row).maxnreg == 0


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    monkeypatch.delenv(launch.PDL_ENV, raising=False)
    return record_launches(monkeypatch, launch)


def _weights(k: int, bits: int = 4, group: int = 128) -> Any:
    fmt = GPTQ(bits=bits, group_size=group, sym=False)
    src = fmt.quantize(torch.randn(128, k, generator=torch.Generator().manual_seed(3)) * 0.05)
    return HopperWgmmaGPTQ(fmt, "cpu").prepare(src, dtype=torch.bfloat16)


@pytest.mark.parametrize(("bits", "group", "k", "late"), [
    (4, 128, 512, True),   # one scale row per block, an even block count: late
    (4, -1, 512, True),    # one group over K: one row per block too
    (4, 32, 512, False),   # four rows per block: the scale stays in the operand
    (8, 128, 512, False),  # 8-bit codes: not this operand
    (4, 128, 384, False),  # three blocks: no in-flight walk, so no late fold
])
def test_the_late_constexpr_is_bound_only_where_it_applies(recorded: list[Recorder], monkeypatch, bits: int,
                                                            group: int, k: int, late: bool) -> None:
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: LATE)
    launch.linear(torch.randn(2, k, dtype=torch.bfloat16), _weights(k, bits, group))
    (recorder,) = recorded
    assert recorder.constexprs["LATE"] is late
    assert "maxnreg" not in recorder.options


def test_a_register_cap_is_a_launch_option(recorded: list[Recorder], monkeypatch) -> None:
    plan = dataclasses.replace(LATE, ws=True, maxnreg=80)
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plan)
    launch.linear(torch.randn(2, 512, dtype=torch.bfloat16), _weights(512))
    (recorder,) = recorded
    assert recorder.options["maxnreg"] == 80 and recorder.constexprs["WS"] and recorder.constexprs["LATE"]


def _emulate(text: str, word: int) -> int:
    """Runs the shift and LOP3 of ``offset_pair_asm_text`` on one 32-bit word."""
    shift = int(m.group(1)) if (m := re.search(r"shr\.u32 t, \$1, (\d+);", text)) else 0
    mask, magic, lut = re.search(r"lop3\.b32 \$0, t, (0x[0-9A-Fa-f]+), (0x[0-9A-Fa-f]+), (0x[0-9a-f]+);", text).groups()
    a, b, c = (word & 0xFFFFFFFF) >> shift, int(mask, 16), int(magic, 16)
    assert int(lut, 16) == 0xEA  # (a & b) | c
    return (a & b) | c


@pytest.mark.parametrize("fp16", [False, True])
def test_the_offset_operand_is_b_plus_q_exactly_for_every_field(fp16: bool) -> None:
    gen = torch.Generator().manual_seed(11)
    codes = torch.randint(0, 16, (4, 128), generator=gen)
    words = interleave_codes(codes, 4)  # [4, 16]: one block of each row
    where = field_inputs(4)  # [8, 16]: the input of field f of word c
    base = 1024.0 if fp16 else 128.0
    dtype = torch.float16 if fp16 else torch.bfloat16
    for row in range(4):
        for c in range(16):
            for i in range(4):  # slice i: fields i (low half) and i + 4 (high half)
                out = _emulate(offset_pair_asm_text(fp16, 4 * i), int(words[row, c]))
                halves = torch.tensor([out & 0xFFFF, out >> 16], dtype=torch.int32).to(torch.int16).view(dtype)
                expect = [base + codes[row, where[i, c]].item(), base + codes[row, where[i + 4, c]].item()]
                assert halves.float().tolist() == expect


def test_the_fold_gives_the_dequantized_product() -> None:
    """``s·(Σ(B + q)·x − (B + z)·Σx)`` in fp32, per block: the kernel's fold, against the
    float reference ``Σ (q − z)·s·x``."""
    gen = torch.Generator().manual_seed(4)
    q = torch.randint(0, 16, (64, 128), generator=gen).float()
    z = torch.randint(0, 16, (64, 1), generator=gen).float()
    s = torch.rand(64, 1, generator=gen) * 0.02 + 0.001
    x = torch.randn(128, 8, generator=gen).to(torch.bfloat16).float()
    golden = ((q - z) * s).double() @ x.double()
    # The offset cancels in fp32: the error must stay far below the output's own rounding,
    # an eighth of its dtype's epsilon at the output's scale (bf16: B = 128; fp16: 1024).
    for base, out_dtype in ((128.0, torch.bfloat16), (1024.0, torch.float16)):
        part = (base + q) @ x  # the wgmma of the offset operand (exact products, fp32 sums)
        xsum = torch.ones(64, 128) @ x  # the wgmma of ones
        folded = s * (part - (base + z) * xsum)
        err = (folded.double() - golden).abs().max().item()
        assert 0 < err <= torch.finfo(out_dtype).eps / 8 * golden.abs().max().item(), (base, err)


def test_the_sweep_checks_and_times_late_twins_and_ships_none_unchecked() -> None:
    twins = late_twins(Plan(1, 16, 4, 2))
    assert all(t.late_scale and t.in_flight for t in twins) and {t.maxnreg for t in twins if t.ws} == {80, 128}
    assert _kind(dataclasses.asdict(twins[1])) == LATE_KIND
    checked = [p for case in check_cases() for p in case["plans"] if isinstance(p, Plan) and p.late_scale]
    assert {p.bm for p in checked} <= {bm for bm in (8, 16, 32) if bm <= LATE_MAX_BM} and len(checked) >= 12
    for m in (1, 16, 32):
        plans = [p for p in candidates(m, 4096, 14336, 4, 132, None) if isinstance(p, Plan)]
        assert any(p.late_scale for p in plans), m
    assert not any(p.late_scale for p in candidates(1, 4096, 14336, 8, 132, None) if isinstance(p, Plan))
    assert not any(p.late_scale for p in candidates(512, 4096, 14336, 4, 132, None) if isinstance(p, Plan))


def test_the_ring_leaves_room_for_the_tile_of_ones() -> None:
    """``fit_stages`` counts the late plan's ones tile outside the ring: at a shared-memory
    size where the plain plan's ring just fits, the late twin's is one stage shallower."""
    w = _weights(512)
    plain = Plan(1, 8, 12, 1, in_flight=True)
    per = plain.stage_bytes(w.bits, w.scales.element_size(), launch.sub_rows(w), w.zeros is not None)
    smem = launch.SMEM_RESERVE + 6 * per  # six stages exactly
    assert launch.fit_stages(plain, w, smem).stages == 6
    late = dataclasses.replace(plain, late_scale=True)
    assert late.fixed_bytes() == 4096 and launch.fit_stages(late, w, smem).stages == 5
