"""The Triton kernel's pieces and variants under the interpreter (or on a GPU if present):
the word reading of the layout, code conversions, the exact-FMA claim, every routing /
dequantization / gather variant and the fused SwiGLU against the plain-torch kernel, the
routings the issue names (experts with no token, all tokens on one expert, top-k = E,
T = 0) and the tile rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1 (set by the quantcore pytest plugin)", allow_module_level=True)

import triton.language as tl  # noqa: E402

from quantcore.backends.trtllm_moe import TorchMoE, TritonMoE  # noqa: E402
from quantcore.backends.trtllm_moe.tiles import (  # noqa: E402
    ENV_TABLE,
    ONE_LAUNCH_MAX_ROUTES,
    MoETile,
    pick_tile,
    uses_wgmma,
)
from quantcore.backends.trtllm_moe.triton_kernel import MOE_LAYOUT, stored_row_order  # noqa: E402
from quantcore.backends.trtllm_moe.triton_source import MAGIC, word_codes  # noqa: E402
from quantcore.errors import KernelInputError  # noqa: E402
from quantcore.formats.trtllm_moe import TRTLLMMoE  # noqa: E402
from quantcore.ops.moe import moe_ffn, swiglu  # noqa: E402
from quantcore.probe.card_tables import card_of  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
TOL = {torch.bfloat16: 2 * 2.0**-8, torch.float16: 2 * 2.0**-11}


@triton.jit
def _codes(w_ptr, out_ptr, ASM: tl.constexpr):
    offs = tl.arange(0, 256)
    b0, b1, b2, b3 = word_codes(tl.load(w_ptr + offs), ASM)
    tl.store(out_ptr + offs * 4, b0)
    tl.store(out_ptr + offs * 4 + 1, b1)
    tl.store(out_ptr + offs * 4 + 2, b2)
    tl.store(out_ptr + offs * 4 + 3, b3)


@pytest.mark.parametrize("asm", [False, pytest.param(True, marks=pytest.mark.skipif(INTERPRETED, reason="PTX"))])
def test_word_codes_are_exact_for_every_byte_in_every_position(asm: bool) -> None:
    u = torch.arange(256, dtype=torch.int16).to(torch.uint8)
    words = torch.stack([u, u.roll(1), u.roll(2), u.roll(3)], dim=1).contiguous().view(torch.int32).view(-1)
    out = torch.empty(1024, dtype=torch.float32, device=DEVICE)
    _codes[(1,)](words.to(DEVICE), out, ASM=asm)
    expected = words.view(torch.uint8).double() + 2.0**23
    assert torch.equal(out.cpu().double(), expected)
    assert torch.equal((out.cpu() - MAGIC).double(), words.view(torch.uint8).double() - 128)


def test_each_word_holds_the_rows_of_one_mma_fragment_thread() -> None:
    """Word c of a 16-row block holds rows 2c, 2c+8, 2c+1, 2c+9 (bytes 0..3): the kernel
    reads bytes 0, 2 as k = 2c, 2c+1 and bytes 1, 3 as k = 2c+8, 2c+9."""
    k = 128
    rows = (torch.arange(k) % 256 - 128).to(torch.int8).view(k, 1).expand(k, 32).contiguous()
    layout = MOE_LAYOUT.apply(rows)  # [K, N] bytes; column 0's K bytes are its first
    column0 = (layout.view(-1)[:64].to(torch.int16) & 0xFF).view(4, 4, 4)  # [block, word, byte]
    c = torch.arange(4).view(1, 4)
    block = torch.arange(4).view(4, 1) * 16
    for byte, offset in enumerate((0, 8, 1, 9)):
        assert torch.equal(column0[:, :, byte], block + 2 * c + offset)


def test_stored_row_order_is_the_closed_form() -> None:
    j = torch.arange(64)
    sigma = 16 * (j // 16) + (j % 16) // 2 + 8 * (j % 2)
    assert torch.equal(stored_row_order(128, torch.device("cpu")), torch.cat([sigma, sigma + 64]))


def test_the_fused_dequant_fma_is_exact_for_bf16_scales_only() -> None:
    """``fma(2²³ + u, s, −(2²³ + 128)·s) = (u − 128)·s`` exactly when the constant is
    exact in float32: every bf16 scale (8-bit significand), not every fp16 one."""
    u = torch.arange(256, dtype=torch.float64).view(-1, 1)
    bf16 = torch.randn(4096, generator=torch.Generator().manual_seed(0)).bfloat16()
    for scales, exact in ((bf16, True), (bf16.half(), True), (torch.tensor([1.0009765625]).half(), False)):
        s32 = scales.float()
        c32 = s32 * -MAGIC  # float32 product, as the kernel forms it
        if exact:
            assert torch.equal(c32.double(), scales.double() * -MAGIC)
            fused = ((u + 2**23) * s32.double() + c32.double()).float()  # one rounding, as FFMA
            assert torch.equal(fused.double(), (u - 128) * scales.double())
        else:
            assert not torch.equal(c32.double(), scales.double() * -MAGIC)


FORMATS = [(64, True, torch.bfloat16), (64, False, torch.float16), (128, False, torch.bfloat16)]
VARIANTS = [
    MoETile(16, 32, 64, asm=False),
    MoETile(16, 64, 64, asm=False, pre_scale=False),
    MoETile(16, 32, 64, asm=False, scale_pairs=False),
    MoETile(16, 64, 64, scheduled=True, persistent=0, asm=False),
    MoETile(16, 64, 64, scheduled=True, persistent=0, asm=False, schedule_kernel=True),
    MoETile(32, 32, 64, scheduled=True, persistent=0, x_sorted=True, asm=False),
    MoETile(16, 32, 64, scheduled=True, persistent=1, pre_scale=False, asm=False),
    MoETile(64, 32, 64, scheduled=True, persistent=0, split_tail=True, asm=False),
]


def _setup(gs: int, sym: bool, dtype: torch.dtype, e: int = 4, k: int = 128, n: int = 128, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    fmt = TRTLLMMoE(group_size=gs, sym=sym, scale_dtype=dtype)
    tensors = fmt.quantize(torch.randn(e, k, n, generator=gen) * 0.05 + torch.randn(e, 1, n, generator=gen) * 0.02)
    ref, kernel = TorchMoE(fmt, DEVICE), TritonMoE(fmt, DEVICE)
    return gen, ref, ref.prepare(tensors, dtype=dtype), kernel, kernel.prepare(tensors, dtype=dtype)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).norm() / ref.float().norm())


@pytest.mark.parametrize(("gs", "sym", "dtype"), FORMATS, ids=["g64-sym-bf16", "g64-asym-fp16", "g128-asym-bf16"])
def test_every_variant_matches_the_torch_kernel(gs: int, sym: bool, dtype: torch.dtype) -> None:
    gen, ref_kernel, ref_w, kernel, w = _setup(gs, sym, dtype)
    x = torch.randn(5, 128, generator=gen).to(dtype).to(DEVICE)
    ids = torch.rand(5, 4, generator=gen).argsort(dim=1)[:, :2].to(torch.int32).to(DEVICE)
    ref = ref_kernel(x, ids, ref_w)
    refused = uses_wgmma(card_of(DEVICE)) and dtype == torch.float16  # pre-scaled fp16 on sm_90: test_wgmma_hazard.py
    for tile in VARIANTS:
        if refused and tile.pre_scale:
            with pytest.raises(KernelInputError, match="pre_scale"):
                kernel.forward(x, ids, w, tile=tile)
            continue
        y = kernel.forward(x, ids, w, tile=tile)
        assert y.shape == ref.shape and y.dtype == dtype
        assert _rel(y, ref) < TOL[dtype], tile


@pytest.mark.parametrize("tile", [None, MoETile(16, 32, 64, scheduled=True, persistent=0, asm=False)],
                         ids=["default", "scheduled"])
def test_fused_swiglu_matches_the_unfused_ffn_half(tile: MoETile | None) -> None:
    gen, ref_kernel, ref_w, kernel, w = _setup(64, False, torch.bfloat16)
    x = torch.randn(6, 128, generator=gen).bfloat16().to(DEVICE)
    ids = torch.rand(6, 4, generator=gen).argsort(dim=1)[:, :2].to(torch.int32).to(DEVICE)
    a = kernel.forward(x, ids, w, gated=True, tile=tile)
    expected = swiglu(ref_kernel(x, ids, ref_w).float())  # the default MoEKernel.gated, unrounded
    assert a.shape == (6, 2, 64) and _rel(a, expected) < TOL[torch.bfloat16]
    assert torch.equal(kernel.gated(x, ids, w), kernel.forward(x, ids, w, gated=True))


def test_the_ffn_uses_the_fused_gated_gemm() -> None:
    gen, ref_kernel, ref_w1, kernel, w1 = _setup(64, True, torch.bfloat16, n=128)
    _, _, ref_w2, _, w2 = _setup(64, True, torch.bfloat16, k=64, n=128, seed=1)
    x = torch.randn(3, 128, generator=gen).bfloat16().to(DEVICE)
    ids = torch.rand(3, 4, generator=gen).argsort(dim=1)[:, :2].to(torch.int32).to(DEVICE)
    rw = torch.softmax(torch.randn(3, 2, generator=gen), -1).to(DEVICE)
    out = moe_ffn(kernel, x, ids, rw, w1, w2)
    ref = moe_ffn(ref_kernel, x, ids, rw, ref_w1, ref_w2)
    assert out.shape == (3, 128) and _rel(out, ref) < 2 * TOL[torch.bfloat16]


ROUTINGS = {
    # every token on expert 2: experts 0, 1, 3 get none; 40 routes > bm = 16 blocks
    "one expert": lambda t, e, gen: torch.full((t, 1), 2, dtype=torch.int32),
    "top-k = E": lambda t, e, gen: torch.rand(t, e, generator=gen).argsort(dim=1).to(torch.int32),
    "no token for experts 0, 3": lambda t, e, gen: torch.randint(1, 3, (t, 2), generator=gen, dtype=torch.int32),
    "the same expert twice": lambda t, e, gen: torch.randint(0, e, (t, 1), generator=gen, dtype=torch.int32).expand(t, 2),
}


@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("scheduled", [False, True], ids=["in-kernel", "scheduled"])
def test_awkward_routings_are_exact(routing: str, scheduled: bool) -> None:
    gen, ref_kernel, ref_w, kernel, w = _setup(64, False, torch.bfloat16)
    t = 40 if routing == "one expert" else 9
    ids = ROUTINGS[routing](t, 4, gen).contiguous().to(DEVICE)
    x = torch.randn(t, 128, generator=gen).bfloat16().to(DEVICE)
    # scheduled: 40 routes on one expert = a full 32-route M-tile and a half-width tail
    tile = MoETile(32, 64, 64, scheduled=True, persistent=0, split_tail=True, asm=False) if scheduled else \
        MoETile(16, 64, 64, asm=False)
    ref = ref_kernel(x, ids, ref_w)
    assert _rel(kernel.forward(x, ids, w, tile=tile), ref) < TOL[torch.bfloat16]
    assert _rel(kernel(x, ids, w), ref) < TOL[torch.bfloat16]  # the default tile too


@pytest.mark.parametrize("weighted", [False, True])
def test_no_tokens_gives_an_empty_result(weighted: bool) -> None:
    _, _, _, kernel, w = _setup(64, True, torch.bfloat16)
    x = torch.empty(0, 128, dtype=torch.bfloat16, device=DEVICE)
    ids = torch.empty(0, 2, dtype=torch.int32, device=DEVICE)
    rw = torch.empty(0, 2, device=DEVICE) if weighted else None
    y = kernel(x, ids, w, topk_weights=rw)
    assert y.shape == ((0, 128) if weighted else (0, 2, 128))
    assert kernel.gated(x, ids, w).shape == (0, 2, 64)


@pytest.mark.parametrize(
    ("tile", "match"),
    [
        (MoETile(16, 32, 128), "bk=128 must be a multiple of 64 dividing group_size=64"),
        (MoETile(16, 32, 32), "bk=32"),
        (MoETile(16, 48, 64), "powers of two"),
        (MoETile(16, 32, 64, x_sorted=True), "x_sorted needs the scheduled kernel"),
        (MoETile(16, 16, 64, scheduled=True), "a gated tile pairs 16-row blocks"),
        (MoETile(16, 32, 64, scheduled=True, split_tail=True), "split_tail halves a scheduled M-tile"),
        (MoETile(16, 32, 64, schedule_kernel=True), "schedule_kernel sorts the routes of a scheduled tile"),
    ],
)
def test_bad_tiles_are_refused(tile: MoETile, match: str) -> None:
    fmt = TRTLLMMoE(group_size=64)
    kernel = TritonMoE(fmt, DEVICE)
    w = kernel.prepare(fmt.quantize(torch.randn(2, 128, 64)), dtype=torch.float16)
    x = torch.randn(10, 128).half().to(DEVICE)
    ids = torch.zeros(10, 2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(KernelInputError, match=match):
        kernel.forward(x, ids, w, tile=tile, gated="gated" in match)


def test_in_kernel_routing_refuses_too_many_routes() -> None:
    fmt = TRTLLMMoE(group_size=64)
    kernel = TritonMoE(fmt, DEVICE)
    w = kernel.prepare(fmt.quantize(torch.randn(2, 128, 64)), dtype=torch.float16)
    x = torch.randn(65, 128).half().to(DEVICE)
    ids = torch.zeros(65, 2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(KernelInputError, match="in-kernel routing takes at most 128 routes, the call has 130"):
        kernel.forward(x, ids, w, tile=MoETile(16, 32, 64))


def test_shipped_tiles_follow_routes_per_expert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    decode, prefill = pick_tile(2, 8, 4096, 128), pick_tile(8192, 8, 4096, 128)
    assert not decode.scheduled and decode.bm == 16
    assert prefill.scheduled and prefill.bm >= 128
    assert pick_tile(200, 1, 4096, 128).scheduled  # more routes than in-kernel routing takes
    # one launch up to ONE_LAUNCH_MAX_ROUTES, the scheduling kernel first above
    assert not pick_tile(ONE_LAUNCH_MAX_ROUTES, 8, 4096, 128).two_launches
    assert pick_tile(ONE_LAUNCH_MAX_ROUTES + 1, 8, 4096, 128).two_launches and not prefill.x_sorted
    assert pick_tile(ONE_LAUNCH_MAX_ROUTES + 1, 8, 4096, 128, interpreted=True).two_launches
    assert not pick_tile(ONE_LAUNCH_MAX_ROUTES, 8, 4096, 128, interpreted=True).two_launches
    assert pick_tile(2, 8, 192, 64).bk == 64  # K-tiles inside one group and dividing K
    # wide tiles only for bf16 scales in groups of 128 (see tiles.NARROW)
    assert pick_tile(8192, 8, 4096, 64).bm <= 128
    assert pick_tile(8192, 8, 4096, 128, scale_dtype=torch.float16).bm <= 128
    table = tmp_path / "tiles.json"
    table.write_text('{"table": [[4, {"bm": 16, "bn": 128, "bk": 128}], [1e18, {"bm": 64, "bn": 64, "bk": 64, '
                     '"scheduled": true}]]}')
    monkeypatch.setenv(ENV_TABLE, str(table))
    assert pick_tile(2, 8, 4096, 128) == MoETile(16, 128, 128)
    assert pick_tile(8192, 8, 4096, 128) == MoETile(64, 64, 64, scheduled=True, schedule_kernel=True)
    assert pick_tile(2048, 8, 4096, 128) == MoETile(64, 64, 64, scheduled=True)
    # persistent programs only with bf16 scales
    assert pick_tile(8192, 8, 4096, 128, scale_dtype=torch.float16) == MoETile(64, 64, 64, scheduled=True, persistent=0,
                                                                               schedule_kernel=True)
