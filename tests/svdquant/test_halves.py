"""``Tile.halves``: NVFP4 steps loaded as the two 8-wide halves of every 16-block, so one
thread holds a whole block. Under the interpreter (or on a GPU if present) codes and
scales equal the golden bytes bit for bit on hard rows (zeros, NaN, ±Inf, −0), masked
tails, shared row tiles and the prefetched ``1/smooth``; the LoRA output is the golden's
within float32 rounding (two dots of half depth sum in another order than one). The GPU's
arithmetic paths (the float block max, the dot on the loaded dtype) run too. The options
it cannot go with are refused by name."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1 (set by the quantcore pytest plugin)", allow_module_level=True)

from quantcore.backends.triton_nvfp4 import TritonNVFP4
from quantcore.errors import KernelInputError
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.kernels.svdquant import triton_kernel
from quantcore.kernels.svdquant.triton_kernel import Tile, check_tile
from quantcore.ops.act_quant_lora import act_quant_lora_reference

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" else "cpu"

#: N = 192: bn 128 leaves a masked tail; grids 5, 7 and 13 share row tiles between programs.
TILES = [
    Tile(16, 64, grid=5, halves=True),
    Tile(32, 64, grid=7, halves=True, prefetch=True),
    Tile(64, 128, grid=3, halves=True),
    Tile(16, 32, grid=13, halves=True, prefetch=True),
]


def _inputs(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(300, 192, generator=gen) * 3).to(dtype)
    x[0] = 0
    x[1, 5] = float("nan")
    x[2, 70] = float("inf")
    x[2, 191] = float("-inf")
    x[3] = -0.0
    x[4, 16:32] = 1e-30  # a block whose scale underflows fp8 (rounded up to its smallest)
    layer = {"lora_down": (torch.randn(192, 48, generator=gen) * 0.05).to(torch.bfloat16),
             "smooth": torch.exp(torch.randn(192, generator=gen) * 0.5).to(torch.bfloat16)}
    return x, layer


def _check(tile: Tile, dtype: torch.dtype, seed: int) -> None:
    fmt = SVDQuantAct(fp4=True)
    x, layer = _inputs(seed, dtype)
    kernel = TritonNVFP4(fmt, DEVICE)
    prepared = kernel.prepare({n: t.to(DEVICE) for n, t in layer.items()}, dtype=dtype)
    out = kernel.forward(x.to(DEVICE), prepared, tile=tile)
    ref = act_quant_lora_reference(fmt, x, layer["lora_down"], layer["smooth"])
    assert torch.equal(out.qout.cpu(), ref.qout), f"{tile.describe()}: codes differ from the golden"
    assert torch.equal(out.oscales.cpu().view(torch.uint8), ref.oscales.view(torch.uint8)), \
        f"{tile.describe()}: scales differ from the golden"
    lora, gold = out.lora_act_out.cpu().double(), ref.lora_act_out
    finite = torch.isfinite(gold)
    assert torch.equal(lora.isnan(), gold.isnan()) and torch.equal(torch.isfinite(lora), finite)
    assert ((lora - gold)[finite].abs() <= 1e-5 * gold[finite].abs().max()).all(), "LoRA differs from the golden"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy meets the NaN/Inf blocks
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("tile", TILES, ids=lambda t: f"bm{t.bm}-bn{t.bn}-g{t.grid}-pre{int(t.prefetch)}")
def test_halves_equal_the_golden(tile: Tile, dtype: torch.dtype) -> None:
    _check(tile, dtype, seed=21)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_halves_on_the_gpu_arithmetic_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NaN-propagating float block max of both halves and the dot on the loaded dtype."""
    monkeypatch.setattr(triton_kernel, "gpu_math", lambda: True)
    _check(Tile(16, 64, grid=5, halves=True), torch.float16, seed=22)


@pytest.mark.parametrize(("fp4", "tile", "why"), [
    (False, Tile(64, 64, halves=True), "halves needs NVFP4"),
    (True, Tile(64, 64, halves=True, flat=True), "the per-row-tile walk"),
    (True, Tile(64, 16, halves=True), "bn >= 32"),
])
def test_halves_refused_where_it_cannot_run(fp4: bool, tile: Tile, why: str) -> None:
    with pytest.raises(KernelInputError, match=why):
        check_tile(tile, SVDQuantAct(fp4=fp4), 32)
