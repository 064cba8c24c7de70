"""The Triton kernel's pieces and variants under the interpreter (or on a GPU if present):
code conversions, the layout's row order, every dequantization / routing variant
against the plain-torch kernel, and the tile rules."""

from __future__ import annotations

import itertools
import os

import pytest
import torch

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1 (set by the quantcore pytest plugin)", allow_module_level=True)

import triton.language as tl  # noqa: E402

from quantcore.backends.trtllm_moe import TorchMoE, TritonMoE  # noqa: E402
from quantcore.backends.trtllm_moe.triton_kernel import MoETile, stored_row_order  # noqa: E402
from quantcore.backends.trtllm_moe.triton_source import codes_bf16, codes_f16, codes_f32  # noqa: E402
from quantcore.errors import KernelInputError  # noqa: E402
from quantcore.formats.trtllm_moe import TRTLLMMoE  # noqa: E402

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


@triton.jit
def _convert(u_ptr, f32_ptr, f32_plain_ptr, bf16_ptr, f16_ptr):
    offs = tl.arange(0, 256)
    u = tl.load(u_ptr + offs)
    tl.store(f32_ptr + offs, codes_f32(u, True))
    tl.store(f32_plain_ptr + offs, codes_f32(u, False))
    tl.store(bf16_ptr + offs, codes_bf16(u))
    tl.store(f16_ptr + offs, codes_f16(u))


def test_code_conversions_are_exact_for_every_byte() -> None:
    u = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8).to(DEVICE)  # every biased byte
    outs = [torch.empty(256, dtype=d, device=DEVICE) for d in (torch.float32, torch.float32, torch.bfloat16, torch.float16)]
    _convert[(1,)](u, *outs)
    expected = ((u.to(torch.int16) & 0xFF) - 128).float()  # stored u = q + 128
    for out in outs:
        assert torch.equal(out.float(), expected)


def test_stored_row_order_is_the_closed_form() -> None:
    j = torch.arange(64)
    sigma = 16 * (j // 16) + (j % 16) // 2 + 8 * (j % 2)
    assert torch.equal(stored_row_order(128, torch.device("cpu")), torch.cat([sigma, sigma + 64]))


VARIANTS = [
    (dense, pre, magic, bm)
    for dense, pre, magic, bm in itertools.product((True, False), (True, False), (True, False), (16, 64))
    if not (dense and bm == 64 and not pre)
]


@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_every_variant_matches_the_torch_kernel(sym: bool, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(int(sym))
    fmt = TRTLLMMoE(group_size=64, sym=sym, scale_dtype=dtype)
    tensors = fmt.quantize(torch.randn(4, 128, 64, generator=gen) * 0.05 + 0.01)
    ref_kernel, kernel = TorchMoE(fmt, DEVICE), TritonMoE(fmt, DEVICE)
    ref_w, w = ref_kernel.prepare(tensors, dtype=dtype), kernel.prepare(tensors, dtype=dtype)
    x = torch.randn(5, 128, generator=gen).to(dtype).to(DEVICE)
    ids = torch.rand(5, 4, generator=gen).argsort(dim=1)[:, :2].to(torch.int32).to(DEVICE)
    ref = ref_kernel(x, ids, ref_w).float()
    for dense, pre, magic, bm in VARIANTS:
        for bk in (64,):
            tile = MoETile(bm, 32, bk, dense=dense, pre_scale=pre, magic=magic)
            y = kernel.forward(x, ids, w, tile=tile).float()
            rel = float((y - ref).norm() / ref.norm())
            assert rel < 2 * (2.0**-8 if dtype == torch.bfloat16 else 2.0**-11), f"{tile}: rel {rel:.2e}"


@pytest.mark.parametrize(
    ("tile", "match"),
    [
        (MoETile(16, 32, 128), "bk=128 must be a multiple of 64 dividing group_size=64"),
        (MoETile(16, 32, 32), "bk=32"),
        (MoETile(16, 48, 64), "powers of two"),
        (MoETile(16, 32, 64, dense=True), "a dense launch takes all 20 routes"),
    ],
)
def test_bad_tiles_are_refused(tile: MoETile, match: str) -> None:
    fmt = TRTLLMMoE(group_size=64)
    kernel = TritonMoE(fmt, DEVICE)
    w = kernel.prepare(fmt.quantize(torch.randn(2, 128, 64)), dtype=torch.float16)
    x = torch.randn(10, 128).half().to(DEVICE)
    ids = torch.zeros(10, 2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(KernelInputError, match=match):
        kernel.forward(x, ids, w, tile=tile)
