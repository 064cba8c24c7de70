"""The shared Triton source under the interpreter (or on a GPU if present): the integer
fp8 rounding against torch's float8_e4m3fn cast, the E2M1 comparison tree against
division then rounding at every threshold of every scale, and the kernel against the
golden reference across tiles, splits, masks and hard inputs."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1 (set by the quantcore pytest plugin)", allow_module_level=True)

import triton.language as tl  # noqa: E402

from quantcore.backends.triton_ascend_int4 import TritonAscendInt4  # noqa: E402
from quantcore.backends.triton_nvfp4 import TritonNVFP4  # noqa: E402
from quantcore.errors import KernelInputError  # noqa: E402
from quantcore.formats.svdquant import SVDQuantAct, e2m1_codes  # noqa: E402
from quantcore.kernels.svdquant.triton_kernel import Tile, check_tile, pick_tile  # noqa: E402
from quantcore.kernels.svdquant.triton_source import e2m1_code, e4m3_scale_bits, e4m3_value  # noqa: E402
from quantcore.ops.act_quant_lora import act_quant_lora_reference  # noqa: E402

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
BLOCK = 1 << 16


@triton.jit
def _e4m3_kernel(f_ptr, out_ptr, val_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    bits = e4m3_scale_bits(tl.load(f_ptr + offs, mask=ok, other=0.0))
    tl.store(out_ptr + offs, bits.to(tl.uint8), mask=ok)
    tl.store(val_ptr + offs, e4m3_value(bits), mask=ok)


def e4m3_triton(f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty(f.shape, dtype=torch.uint8, device=f.device)
    val = torch.empty(f.shape, dtype=torch.float32, device=f.device)
    _e4m3_kernel[(triton.cdiv(f.numel(), BLOCK),)](f, out, val, f.numel(), BLOCK=BLOCK)
    return out, val


def _patterns() -> torch.Tensor:
    """The scales the kernel rounds are the floats in [0, 448]: every high half-word
    there (all exponents, the top 7 mantissa bits) with the low half-words on or next to
    a rounding boundary, plus random words in the range."""
    top = 0x43E00000  # 448.0
    high = torch.arange((top >> 16) + 1, dtype=torch.int64) << 16
    low = torch.tensor([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF])
    words = (high[:, None] | low[None, :]).flatten()
    rand = torch.randint(0, top + 1, (1 << 20,), generator=torch.Generator().manual_seed(0))
    words = torch.cat([words, rand])
    return words[words <= top].to(torch.int32).view(torch.float32)


def test_e4m3_integer_rounding_matches_torch_bit_for_bit() -> None:
    f = _patterns().to(DEVICE)
    got, val = e4m3_triton(f)
    want = f.to(torch.float8_e4m3fn).view(torch.uint8)
    bad = (got != want).nonzero()
    assert not len(bad), f"{len(bad)} mismatches, e.g. {f[bad[0, 0]].item()!r}: {got[bad[0, 0]]} vs {want[bad[0, 0]]}"
    assert torch.equal(val, f.to(torch.float8_e4m3fn).float())


@triton.jit
def _e2m1_kernel(a_ptr, s_ptr, out_ptr, n, TREE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    a = tl.load(a_ptr + offs, mask=ok, other=0.0)
    s = tl.load(s_ptr + offs, mask=ok, other=1.0)
    tl.store(out_ptr + offs, e2m1_code(a, s, TREE), mask=ok)


@pytest.mark.parametrize("tree", [0, 1])
def test_e2m1_comparison_tree_equals_division_then_rounding(tree: int) -> None:
    """For every e4m3 scale the kernel can store (2⁻⁹ … 448) and every threshold t, the
    float32 values within 6 ulps of t · s8 (and random ones), of either sign: comparing
    |v| with t · s8 gives the code of fl(v / s8), sign bit included, in both trees."""
    s8 = torch.arange(1, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    t = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    centre = (s8[:, None] * t[None, :]).flatten()  # exact products
    bits = centre.view(torch.int32)[:, None] + torch.arange(-6, 7, dtype=torch.int32)[None, :]
    a = bits.view(torch.float32).flatten()
    scales = s8.repeat_interleave(len(t))[:, None].expand(-1, 13).flatten()
    gen = torch.Generator().manual_seed(1)
    ra = torch.rand(1 << 16, generator=gen) * 8
    rs = s8[torch.randint(0, len(s8), (1 << 16,), generator=gen)]
    a, scales = torch.cat([a, ra * rs]), torch.cat([scales, rs])
    a = torch.where(torch.rand(a.shape, generator=gen) < 0.5, -a, a)
    out = torch.empty(a.shape, dtype=torch.int32, device=DEVICE)
    _e2m1_kernel[(triton.cdiv(a.numel(), BLOCK),)](a.to(DEVICE), scales.to(DEVICE), out, a.numel(), TREE=tree,
                                                   BLOCK=BLOCK)
    want = e2m1_codes(a / scales)  # the golden: IEEE division, nearest, ties to even
    assert torch.equal(out.cpu().long(), want), f"{int((out.cpu().long() != want).sum())} differ"


def _layer(n: int, r: int, smooth: bool, gen: torch.Generator) -> dict[str, torch.Tensor]:
    t = {"lora_down": (torch.randn(n, r, generator=gen) * 0.05).to(torch.bfloat16)}
    if smooth:
        t["smooth"] = torch.exp(torch.randn(n, generator=gen) * 0.5).to(torch.bfloat16)
    return t


def _hard_rows(x: torch.Tensor, fmt: SVDQuantAct) -> torch.Tensor:
    """Row 0 zeros, row 1 a NaN, row 2 an Inf and a -Inf in different blocks, row 3 −0."""
    x = x.clone()
    x[0] = 0
    x[1, 5] = float("nan")
    x[2, 1] = float("inf")
    x[2, -1] = float("-inf")
    x[3] = -0.0
    return x


def _assert_matches_golden(kernel: type, fmt: SVDQuantAct, x: torch.Tensor, layer: dict[str, torch.Tensor],
                           tile: Tile | None = None) -> None:
    k = kernel(fmt, DEVICE)
    prepared = k.prepare({n: t.to(DEVICE) for n, t in layer.items()}, dtype=x.dtype)
    out = k.forward(x.to(DEVICE), prepared, tile=tile) if tile else k(x.to(DEVICE), prepared)
    ref = act_quant_lora_reference(fmt, x, layer["lora_down"], layer.get("smooth"))
    bits = torch.uint8 if fmt.fp4 else torch.int16
    assert torch.equal(out.qout.cpu(), ref.qout), f"{tile}: qout differs"
    assert torch.equal(out.oscales.cpu().view(bits), ref.oscales.view(bits)), f"{tile}: oscales differ"
    lora, gold = out.lora_act_out.cpu().double(), ref.lora_act_out
    finite = torch.isfinite(gold)
    assert torch.equal(torch.isfinite(lora), finite) and torch.equal(lora.isnan(), gold.isnan())
    if finite.any():
        assert ((lora - gold)[finite].abs() <= 1e-5 * gold[finite].abs().max().clamp_min(1e-30)).all()


#: Grids that split row tiles between programs in every way: a tile shared by 2 or 3
#: programs, programs spanning tile boundaries, more programs than steps, one program.
TILES = [Tile(16, 64, grid=5), Tile(64, 128, grid=3), Tile(32, 64, grid=7), Tile(128, 256, num_warps=8, num_stages=1),
         Tile(64, 64, grid=40, tree=0), Tile(32, 64, grid=1)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy meets the NaN/Inf rows
@pytest.mark.parametrize("fp4", [True, False], ids=["nvfp4", "int4"])
@pytest.mark.parametrize("tile", TILES, ids=lambda t: f"bm{t.bm}-bn{t.bn}-g{t.grid}-t{t.tree}")
def test_kernel_equals_golden_across_tiles(fp4: bool, tile: Tile) -> None:
    """N = 192 (not a multiple of 128 or 256: masked tails), R = 48 (not a power of
    two), M = 300 (pads to 512), smooth, non-contiguous rows, and the hard rows; the
    LoRA partials of shared row tiles summed by whichever program finishes a tile last."""
    fmt = SVDQuantAct(fp4=fp4)
    if tile.bn % fmt.block:
        pytest.skip("bn below the INT4 block")
    gen = torch.Generator().manual_seed(3)
    wide = (torch.randn(300, 256, generator=gen) * 3).to(torch.float16)
    x = _hard_rows(wide[:, :192], fmt)
    _assert_matches_golden(TritonNVFP4 if fp4 else TritonAscendInt4, fmt, x, _layer(192, 48, True, gen), tile)


@pytest.mark.parametrize("fp4", [True, False], ids=["nvfp4", "int4"])
@pytest.mark.parametrize(("m", "r", "smooth", "dtype"), [
    (1, 0, False, torch.bfloat16), (17, 256, False, torch.float16), (256, 32, True, torch.bfloat16),
])
def test_kernel_equals_golden_default_tile(fp4: bool, m: int, r: int, smooth: bool, dtype: torch.dtype) -> None:
    fmt = SVDQuantAct(fp4=fp4)
    gen = torch.Generator().manual_seed(m + r)
    x = (torch.randn(m, 256, generator=gen) * 2).to(dtype)
    _assert_matches_golden(TritonNVFP4 if fp4 else TritonAscendInt4, fmt, x, _layer(256, r, smooth, gen))


def test_tile_rules() -> None:
    fmt = SVDQuantAct(fp4=False)
    with pytest.raises(KernelInputError, match=r"bn=32 must be a multiple of the block size 64"):
        check_tile(Tile(16, 32), fmt, 8)
    with pytest.raises(KernelInputError, match=r"bm=48"):
        check_tile(Tile(48, 64), fmt, 8)
    with pytest.raises(KernelInputError, match=r"R=300 > 256"):
        check_tile(Tile(16, 64), fmt, 300)
    check_tile(pick_tile(4352, 10240, 128, False), fmt, 128)


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU the compiled path runs everywhere already")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("fp4", [True, False], ids=["nvfp4", "int4"])
def test_compiled_code_path_under_the_interpreter(fp4: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's arithmetic (NaN-propagating float block max, dot on the loaded dtype,
    both E2M1 trees) run by the interpreter: fp16, whose dot the interpreter computes
    correctly, with the hard rows. (The fp8 conversion and the fused Markstein fma need
    the GPU: tests/svdquant/test_cuda.py and test_div.py.)"""
    from quantcore.kernels.svdquant import triton_kernel

    monkeypatch.setattr(triton_kernel, "gpu_math", lambda: True)
    fmt = SVDQuantAct(fp4=fp4)
    gen = torch.Generator().manual_seed(11)
    x = _hard_rows((torch.randn(20, 128, generator=gen) * 3).to(torch.float16), fmt)
    layer = _layer(128, 16, True, gen)
    for tree in (0, 1):
        _assert_matches_golden(TritonNVFP4 if fp4 else TritonAscendInt4, fmt, x, layer, Tile(16, 64, grid=3, tree=tree))
