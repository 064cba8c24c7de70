"""The hopper_wgmma layout: each thread's fragment words together, the kernel's view of
them equal to the codes, the bit-exact round trip, refusals, bytes."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.hopper_wgmma.layout import (
    TILE_N,
    GPTQToHopper,
    fragment_order,
    row_order,
)
from quantcore.errors import UnsupportedProblemError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.kernels.gptq_pairs.layout import block_k
from quantcore.transforms.awq_gptq import AWQToGPTQ, gptq_format_for
from tests.gptq_pairs_cases import BYTES_CASES, ROUND_TRIP_FORMATS, prepared_and_stored_bytes


def test_fragment_order_is_invertible() -> None:
    words = torch.randint(-(2**31), 2**31 - 1, (128, 3 * 16), generator=torch.Generator().manual_seed(0),
                          dtype=torch.int32)
    frag = fragment_order(words)
    assert frag.shape == (2, 3 * 1024)
    assert torch.equal(row_order(frag), words)


def test_fragment_order_by_hand() -> None:
    """Word ``1024·(tile·blocks + block) + 512h + 4t + j`` holds word ``u + 4j`` of row
    ``64·tile + 16w + 8h + g``, with thread ``t = 32w + 4g + u``."""
    tiles, blocks = 2, 2
    row = torch.arange(tiles * TILE_N).view(-1, 1)
    col = torch.arange(blocks * 16).view(1, -1)
    words = (row * 1000 + col).to(torch.int32)  # each word names its row and column
    frag = fragment_order(words)
    for tile, block, h, w, g, u, j in [(0, 0, 0, 0, 0, 0, 0), (1, 1, 1, 3, 7, 3, 3), (0, 1, 1, 2, 5, 1, 2)]:
        t = 32 * w + 4 * g + u
        got = frag[tile, 1024 * block + 512 * h + 4 * t + j].item()
        assert got == (64 * tile + 16 * w + 8 * h + g) * 1000 + 16 * block + u + 4 * j


def _kernel_view(qweight: torch.Tensor, tile: int, block: int) -> torch.Tensor:
    """What ``kernels.py`` hands wgmma for one (tile, block): the int16 view of the
    block's words, reshaped and permuted exactly as the kernel does, ``[64, 32]``."""
    words16 = qweight.view(torch.int16).view(qweight.shape[0], -1, 8, 256)[tile, block]  # [8, 256]
    w7 = words16.reshape(2, 4, 8, 4, 4, 2)  # (h, w, g, t, j, b)
    return w7.permute(1, 0, 2, 4, 3, 5).reshape(64, 32)  # (w, h, g, j, t, b)


@pytest.mark.parametrize("bits", [4, 8])
def test_kernel_view_holds_the_codes(bits: int) -> None:
    """Element (r, e) of the operand source, field i, is the code of row r and input
    32·i + e of the block: the fragment mapping the kernel relies on."""
    fmt = GPTQ(bits=bits, group_size=128)
    gen = torch.Generator().manual_seed(bits)
    src = fmt.quantize(torch.randn(128, 512, generator=gen) * 0.05, generator=gen)
    dst = GPTQToHopper(fmt).apply(src)
    codes = fmt.unpack_weight(src).T  # [N, K]
    bk, pairs = block_k(bits), 16 // bits
    for tile in range(2):
        for block in range(512 // bk):
            view = _kernel_view(dst.qweight, tile, block).to(torch.int32) & 0xFFFF
            for i in range(pairs):
                got = (view >> (bits * i)) & ((1 << bits) - 1)
                want = codes[64 * tile: 64 * tile + 64, block * bk + 32 * i: block * bk + 32 * i + 32]
                assert torch.equal(got, want), (tile, block, i)


FORMATS = [*ROUND_TRIP_FORMATS, GPTQ(bits=8, group_size=32)]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.slug)
@pytest.mark.parametrize(("n", "k"), [(64, 256), (200, 1056)])
def test_transform_round_trip(fmt: GPTQ, n: int, k: int) -> None:
    """Bit-exact, with N not a multiple of the 64-row tile and K not of the block."""
    if fmt.group_size > 0 and k % fmt.group_size:
        k -= k % fmt.group_size
    gen = torch.Generator().manual_seed(n + k)
    src = fmt.quantize(torch.randn(n, k, generator=gen) * 0.05, generator=gen)
    src["bias"] = torch.randn(n, generator=gen).half()
    tr = GPTQToHopper(fmt)
    dst = tr.apply(src)
    assert dst.qweight.shape[0] == -(-n // TILE_N)
    assert dst.scales.shape[1] % TILE_N == 0
    assert (dst.zeros is None) == fmt.sym
    back = tr.invert(dst)
    assert back.keys() == src.keys()
    for name in src:
        assert torch.equal(back[name], src[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_keeps_the_scale_dtype(dtype: torch.dtype) -> None:
    fmt = GPTQ(bits=4, group_size=64)
    src = fmt.quantize(torch.randn(64, 256, generator=torch.Generator().manual_seed(1)) * 0.05)
    src["scales"] = src["scales"].to(dtype)
    dst = GPTQToHopper(fmt).apply(src)
    assert dst.scales.dtype == dtype
    assert torch.equal(GPTQToHopper(fmt).invert(dst)["scales"], src["scales"])


def test_awq_round_trip_through_gptq_lanes() -> None:
    fmt = AWQ(bits=4, group_size=128)
    src = fmt.quantize(torch.randn(128, 512, generator=torch.Generator().manual_seed(2)) * 0.05)
    gfmt = gptq_format_for(fmt)
    dst = GPTQToHopper(gfmt).apply(AWQToGPTQ(fmt).apply(src))
    back = AWQToGPTQ(fmt).invert(GPTQToHopper(gfmt).invert(dst))
    assert back.keys() == src.keys()
    assert all(torch.equal(back[name], src[name]) for name in src)


def test_act_order_keeps_one_scale_row_per_group() -> None:
    """An act-order checkpoint sorts into runs of whole groups: no group map, x permuted."""
    fmt = GPTQ(bits=4, group_size=32, desc_act=True)
    src = fmt.quantize(torch.randn(64, 128, generator=torch.Generator().manual_seed(0)))
    dst = GPTQToHopper(fmt).apply(src)
    assert dst.sub_group == 32 and dst.group_map is None and dst.ret_idx is not None
    assert dst.scales.shape[0] == 4
    back = GPTQToHopper(fmt).invert(dst)
    assert all(torch.equal(back[k], src[k]) for k in src)


def test_sub_groups_past_k_map_to_the_last_group() -> None:
    """K = 1056 with groups of 32 pads to 1152 inputs: the three sub-groups past K reuse
    the last group's row (a group map), and the inverse drops them."""
    fmt = GPTQ(bits=4, group_size=32)
    src = fmt.quantize(torch.randn(64, 1056, generator=torch.Generator().manual_seed(0)))
    dst = GPTQToHopper(fmt).apply(src)
    assert dst.scales.shape[0] == 36 and dst.group_map is not None
    assert dst.group_map[-4:].tolist() == [32, 32, 32, 32]
    back = GPTQToHopper(fmt).invert(dst)
    assert all(torch.equal(back[k], src[k]) for k in src)


def test_refuses_an_empty_group() -> None:
    fmt = GPTQ(bits=4, group_size=32, desc_act=True)
    src = fmt.quantize(torch.randn(64, 96, generator=torch.Generator().manual_seed(0)))
    src["g_idx"] = torch.tensor([0] * 64 + [2] * 32, dtype=torch.int32)  # group 1 holds nothing
    with pytest.raises(UnsupportedProblemError, match="only 2 hold inputs"):
        GPTQToHopper(fmt).apply(src)


def test_refuses_sub_groups_that_straddle_a_block() -> None:
    fmt = GPTQ(bits=4, group_size=32, desc_act=True)
    src = fmt.quantize(torch.randn(64, 384, generator=torch.Generator().manual_seed(0)))
    src["g_idx"] = (torch.arange(384) // 192).to(torch.int32)  # groups of 192: neither divides 128 nor is a multiple
    with pytest.raises(UnsupportedProblemError, match="gcd 192"):
        GPTQToHopper(fmt).apply(src)


@pytest.mark.parametrize(("bits", "group_size", "sym"), BYTES_CASES)
def test_prepared_bytes_within_a_tenth_of_the_checkpoint(bits: int, group_size: int, sym: bool) -> None:
    prepared, stored = prepared_and_stored_bytes(GPTQToHopper, bits, group_size, sym)
    assert prepared <= 1.1 * stored
