"""Expert ids outside ``[0, E)`` in the Triton kernels (the contract of triton_source.py,
'Stray ids'): every memory access stays inside the call's tensors, the routes with such
an id get NaN rows, and every other route's row is the one the same call computes with
valid ids, and the golden one. Under Triton's interpreter every load and store is
checked against the call's tensors (tests/interpreter_bounds.py); on a GPU the compiled
kernels run the same cases (the NaN rows and the untouched ones). For the in-kernel and
the scheduled tiles."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest
import torch

pytest.importorskip("triton")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1 (set by the quantcore pytest plugin)", allow_module_level=True)
DEVICE = "cpu" if INTERPRETED else "cuda"

from quantcore.backends.trtllm_moe import TritonMoE  # noqa: E402
from quantcore.backends.trtllm_moe.tiles import MoETile  # noqa: E402
from quantcore.backends.trtllm_moe.triton_source import route_schedule_kernel, schedule_words  # noqa: E402
from quantcore.formats.trtllm_moe import TRTLLMMoE  # noqa: E402
from quantcore.ops.moe import moe_gemm_reference, swiglu  # noqa: E402
from tests.interpreter_bounds import bounds_checked  # noqa: E402

E, K, N, T, TOPK = 4, 128, 128, 9, 2
TILES = {
    "in-kernel": MoETile(16, 64, 64, asm=False),
    # 32-route M-tiles with a half-width tail: the stray group is split across tiles too;
    # each program finds its routes in the ids, or the scheduling kernel sorts them first
    "scheduled": MoETile(32, 64, 64, scheduled=True, persistent=0, split_tail=True, asm=False),
    "scheduled-two-launches": MoETile(32, 64, 64, scheduled=True, persistent=0, split_tail=True, asm=False,
                                      schedule_kernel=True),
    "scheduled-x-sorted": MoETile(16, 64, 64, scheduled=True, persistent=0, x_sorted=True, asm=False),
}
#: Stray ids per dtype: -1, E, the largest int32, and for int64 values that int32
#: truncation would turn into valid experts (2³² + 1 → 1, -2³² → 0).
STRAYS = {torch.int32: (-1, E, 2**31 - 1, -(2**31)), torch.int64: (-1, E, 2**31 - 1, 2**32 + 1, -(2**32))}
TOL = 2 * 2.0**-8  # bf16, relative Frobenius error, as the other kernel tests


def _accesses_checked(untouched: tuple[torch.Tensor, ...] = ()) -> Any:
    """Every load and store bounds-checked under the interpreter, none touching the
    ``untouched`` tensors (yields the count of accesses checked); on a GPU the compiled
    kernels run unobserved (yields [-1])."""
    return bounds_checked(untouched) if INTERPRETED else contextlib.nullcontext([-1])


def _routing(dtype: torch.dtype, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, clean, stray)``: ids with the stray values at random routes, the same ids
    with valid experts there, and the mask of the stray routes."""
    clean = torch.randint(0, E, (T, TOPK), generator=gen, dtype=dtype)
    strays = STRAYS[dtype]
    where = torch.randperm(T * TOPK, generator=gen)[: len(strays)]
    ids = clean.clone().view(-1)
    ids[where] = torch.tensor(strays, dtype=dtype)
    stray = torch.zeros(T * TOPK, dtype=torch.bool)
    stray[where] = True
    return ids.view(T, TOPK).to(DEVICE), clean.to(DEVICE), stray.view(T, TOPK).to(DEVICE)


def _setup(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    fmt = TRTLLMMoE(group_size=64, sym=False, scale_dtype=torch.bfloat16)
    tensors = fmt.quantize(torch.randn(E, K, N, generator=gen) * 0.05 + torch.randn(E, 1, N, generator=gen) * 0.02)
    kernel = TritonMoE(fmt, DEVICE)
    return gen, kernel, kernel.prepare(tensors, dtype=torch.bfloat16), fmt.dequantize(tensors).to(DEVICE)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("tile", list(TILES))
def test_stray_routes_get_nan_rows_and_the_others_are_untouched(tile: str, dtype: torch.dtype) -> None:
    gen, kernel, w, dense = _setup()
    x = torch.randn(T, K, generator=gen).bfloat16().to(DEVICE)
    ids, clean, stray = _routing(dtype, gen)
    with _accesses_checked() as checked:
        y = kernel.forward(x, ids, w, tile=TILES[tile])
    assert checked[0] != 0
    assert y.shape == (T, TOPK, N)
    assert y[stray].isnan().all()
    assert not y[~stray].isnan().any()
    assert torch.equal(y[~stray], kernel.forward(x, clean, w, tile=TILES[tile])[~stray])
    gold = moe_gemm_reference(x, clean, dense)
    assert _rel(y[~stray], gold[~stray]) < TOL


@pytest.mark.parametrize("tile", ["in-kernel", "scheduled", "scheduled-two-launches"])
def test_weighted_and_gated_calls_give_nan_where_a_stray_route_goes(tile: str) -> None:
    gen, kernel, w, dense = _setup(1)
    x = torch.randn(T, K, generator=gen).bfloat16().to(DEVICE)
    ids, clean, stray = _routing(torch.int64, gen)
    rw = torch.softmax(torch.randn(T, TOPK, generator=gen), dim=-1).to(DEVICE)
    with _accesses_checked():
        y = kernel.forward(x, ids, w, topk_weights=rw, tile=TILES[tile])
        a = kernel.forward(x, ids, w, gated=True, tile=TILES[tile])
    hit = stray.any(dim=1)  # a token's weighted sum is NaN when one of its routes is stray
    assert y.shape == (T, N) and y[hit].isnan().all() and not y[~hit].isnan().any()
    assert _rel(y[~hit], moe_gemm_reference(x, clean, dense, rw)[~hit]) < TOL
    assert a.shape == (T, TOPK, N // 2) and a[stray].isnan().all() and not a[~stray].isnan().any()
    assert _rel(a[~stray], swiglu(moe_gemm_reference(x, clean, dense))[~stray]) < TOL


def test_all_routes_stray_give_nan_and_read_no_weight() -> None:
    gen, kernel, w, _ = _setup()
    x = torch.randn(T, K, generator=gen).bfloat16().to(DEVICE)
    ids = torch.full((T, TOPK), E, dtype=torch.int32, device=DEVICE)
    ids[::2, 0] = -1
    for tile in TILES.values():
        with _accesses_checked((w.layout, w.scales, w.zeros)) as checked:
            assert kernel.forward(x, ids, w, tile=tile).isnan().all()
        assert checked[0] != 0


def test_the_schedule_sorts_stray_routes_last() -> None:
    ids = torch.tensor([3, -1, 0, 7, 3, 2**31 - 1, 1, 0, 4], dtype=torch.int32, device=DEVICE)  # E = 4: 4 strays
    r, e, bm, n_tiles = 9, 4, 2, 3
    sched = torch.full((schedule_words(r, e, True),), -7, dtype=torch.int32, device=DEVICE)
    with _accesses_checked():
        route_schedule_kernel[(1,)](ids, sched, r, e, n_tiles, 2, R_MAX=16, BM=bm, E_PAD=4, CHUNK=16,
                                    WRITE_TOKENS=True)
    starts, tiles, order, tokens = sched.cpu().split([e + 2, e + 2, r, r])
    assert order.tolist() == [2, 7, 6, 0, 4, 1, 3, 5, 8]  # experts 0, 1, 3 stably, then the stray routes
    assert starts.tolist() == [0, 2, 3, 3, 5, 9]  # expert 2 has none; the stray routes start at 5
    assert tiles.tolist() == [0, 3, 6, 6, 9, 15]  # ceil(count / 2) M-tiles × 3 N-tiles; 4 strays: 2 M-tiles
    assert torch.equal(tokens, order // 2)
