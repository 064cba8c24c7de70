"""The kernel's plan options (``Tile.flat``, ``Tile.prefetch``, ``Tile.red``) under the
interpreter (or on a GPU if present): each equals the golden bytes, and since none of them
changes which steps a row tile's partials hold or the order they are summed in, each
gives the LoRA output of the plain plan with the same tile and grid bit for bit — a
reduction that skipped, repeated or reordered a slot would differ. Grids share a row tile
among up to 6 programs, start and end programs mid-tile, and leave programs stepping
through several whole tiles."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1 (set by the quantcore pytest plugin)", allow_module_level=True)

from quantcore.backends.triton_ascend_int4 import TritonAscendInt4
from quantcore.backends.triton_nvfp4 import TritonNVFP4
from quantcore.errors import KernelInputError
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.kernels.svdquant import triton_launch
from quantcore.kernels.svdquant.triton_kernel import Tile, check_tile, launch_geometry
from quantcore.ops.act_quant_lora import ActQuantLoraOutput, act_quant_lora_reference

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" else "cpu"

#: (plain tile, the plans tried on it), N = 192 and M_pad = 512 (see _inputs). Grids 5, 7
#: and 13 start and end programs mid-tile with whole row tiles between (3 steps a tile at
#: bn 64); grid 3 at bn 128 splits the masked tail's tiles; grid 1 walks every tile whole;
#: bn 16 (NVFP4 only: 12 steps a tile) at grid 40 shares each row tile among 5–6 programs.
PLANS = [
    (Tile(16, 64, grid=5), [dict(flat=True), dict(prefetch=True), dict(flat=True, prefetch=True, red=2)]),
    (Tile(32, 64, grid=7), [dict(flat=True), dict(red=4), dict(flat=True, prefetch=True)]),
    (Tile(16, 64, grid=13), [dict(flat=True, red=8), dict(prefetch=True, red=2)]),
    (Tile(64, 128, grid=3), [dict(flat=True, prefetch=True)]),
    (Tile(32, 64, grid=1), [dict(flat=True, prefetch=True)]),
    (Tile(64, 16, grid=40), [dict(flat=True), dict(red=4), dict(flat=True, prefetch=True, red=8)]),
]
CASES = [(base, dataclasses.replace(base, **plan)) for base, plans in PLANS for plan in plans]


def _name(tile: Tile) -> str:
    return f"bm{tile.bm}-bn{tile.bn}-g{tile.grid}-" + "-".join(
        f"{k}{int(v)}" for k, v in (("flat", tile.flat), ("pre", tile.prefetch), ("red", tile.red)))


def _inputs(seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """M = 300 rows (padded to 512), N = 192 (a masked tail for 128-wide steps), R = 48
    (not a power of two), smooth on, fresh random values with a NaN and an Inf block."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(300, 192, generator=gen) * 3).to(torch.float16)
    x[1, 5] = float("nan")
    x[2, 70] = float("inf")
    layer = {"lora_down": (torch.randn(192, 48, generator=gen) * 0.05).to(torch.bfloat16),
             "smooth": torch.exp(torch.randn(192, generator=gen) * 0.5).to(torch.bfloat16)}
    return x, layer


def _run(fp4: bool, tile: Tile, x: torch.Tensor, layer: dict[str, torch.Tensor]) -> ActQuantLoraOutput:
    fmt = SVDQuantAct(fp4=fp4)
    kernel = (TritonNVFP4 if fp4 else TritonAscendInt4)(fmt, DEVICE)
    prepared = kernel.prepare({n: t.to(DEVICE) for n, t in layer.items()}, dtype=x.dtype)
    return kernel.forward(x.to(DEVICE), prepared, tile=tile)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy meets the NaN/Inf blocks
@pytest.mark.parametrize("fp4", [True, False], ids=["nvfp4", "int4"])
@pytest.mark.parametrize(("base", "plan"), CASES, ids=[_name(p) for _, p in CASES])
def test_plan_equals_golden_and_the_plain_plan(fp4: bool, base: Tile, plan: Tile) -> None:
    x, layer = _inputs(7)
    fmt = SVDQuantAct(fp4=fp4)
    if plan.bn % fmt.block:
        pytest.skip("bn below the INT4 block")
    programs, row_tiles, _ = launch_geometry(plan, 512, 192, 1)
    assert programs == plan.grid and row_tiles == 512 // plan.bm
    out, plain = _run(fp4, plan, x, layer), _run(fp4, base, x, layer)
    ref = act_quant_lora_reference(fmt, x, layer["lora_down"], layer["smooth"])
    bits = torch.uint8 if fp4 else torch.int16
    assert torch.equal(out.qout.cpu(), ref.qout), "codes differ from the golden"
    assert torch.equal(out.oscales.cpu().view(bits), ref.oscales.view(bits)), "scales differ from the golden"
    lora, gold = out.lora_act_out.cpu().double(), ref.lora_act_out
    finite = torch.isfinite(gold)
    assert torch.equal(lora.isnan(), gold.isnan()) and torch.equal(torch.isfinite(lora), finite)
    assert ((lora - gold)[finite].abs() <= 1e-5 * gold[finite].abs().max()).all(), "LoRA differs from the golden"
    assert torch.equal(out.lora_act_out.cpu().view(torch.int32), plain.lora_act_out.cpu().view(torch.int32)), \
        "LoRA is not bit-identical to the plain plan's (same steps, same slot order)"


@pytest.mark.parametrize("plan", [Tile(16, 64, grid=7, flat=True), Tile(16, 64, grid=7, red=4)],
                         ids=["flat", "red4"])
def test_kept_tickets_return_to_zero(plan: Tile, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the kept ticket buffer a GPU uses (per-thread tickets in the flat plan), the
    last program of each shared row tile resets its counter, so a second call sums the
    same partials and every counter is 0 afterwards."""
    monkeypatch.setattr(triton_launch, "keeps_scratch", lambda device: True)
    x, layer = _inputs(9)
    fmt = SVDQuantAct(fp4=True)
    kernel = TritonNVFP4(fmt, DEVICE)
    prepared = kernel.prepare({n: t.to(DEVICE) for n, t in layer.items()}, dtype=x.dtype)
    first = kernel.forward(x.to(DEVICE), prepared, tile=plan)
    second = kernel.forward(x.to(DEVICE), prepared, tile=plan)
    assert torch.equal(first.lora_act_out.view(torch.int32), second.lora_act_out.view(torch.int32))
    (bucket,) = triton_launch.launch_state(prepared.lora_down).values()
    tickets = bucket._kept_scratch()[1]
    assert bucket.shared and int(tickets[: bucket.row_tiles].abs().sum()) == 0


def test_red_must_be_a_small_power_of_two() -> None:
    with pytest.raises(KernelInputError, match=r"red=3 must be 1, 2, 4 or 8"):
        check_tile(Tile(16, 64, red=3), SVDQuantAct(fp4=True), 32)
