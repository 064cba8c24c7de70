"""trtllm_moe_triton's bound launches (triton_launch.py): one bucket per tile, route-count
power of two, dtype and variant, kept with the prepared weights; a fixed argument never
changes its specialisation within a bucket; every call is still checked, but on CUDA
without reading the expert ids, and a call runs no torch op beyond its allocations and
the weighted sum.

The launches are replaced by a recorder (no GPU), with the planning of the interpreter
and of a stand-in H100 (its shipped tile table).
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any
from unittest.mock import Mock

import pytest
import torch

from quantcore.backends.trtllm_moe import triton_kernel as kernel_mod
from quantcore.backends.trtllm_moe import triton_launch
from quantcore.backends.trtllm_moe.tiles import (
    ONE_LAUNCH_MAX_ROUTES,
    MoETile,
    pick_tile,
    pow2_at_least,
)
from quantcore.backends.trtllm_moe.triton_kernel import TritonMoE, reads_ids
from quantcore.errors import KernelInputError
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.probe.card_tables import H100_SXM
from tests.aten_ops import AtenOps
from tests.launch_recorder import Recorder, assert_fixed_arguments_specialise_alike, record_launches


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    return record_launches(monkeypatch, triton_launch)


def _weights(e: int = 8, k: int = 128, n: int = 128) -> tuple[TritonMoE, Any]:
    fmt = TRTLLMMoE(group_size=64, scale_dtype=torch.bfloat16)
    kernel = TritonMoE(fmt, "cpu")
    gen = torch.Generator().manual_seed(0)
    return kernel, kernel.prepare(fmt.quantize(torch.randn(e, k, n, generator=gen) * 0.05), dtype=torch.bfloat16)


@pytest.mark.parametrize("planning", ["interpreter", "gpu"])
def test_fixed_arguments_specialise_alike_on_every_call_of_a_bucket(
    recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch, planning: str,
) -> None:
    if planning == "gpu":
        monkeypatch.setattr(kernel_mod, "interpreted", lambda: False)
        monkeypatch.setattr(kernel_mod, "_facts", lambda device: (H100_SXM, 132))
    kernel, w = _weights()
    gen = torch.Generator().manual_seed(1)
    for t in (1, 1, 2, 3, 9, 16, 40, 64, 65, 150):
        # aligned rows; unaligned rows; rows 136 apart (a stride not divisible by 16)
        for offset, width, weighted, ids_dtype in ((0, 128, False, torch.int32), (1, 128, True, torch.int64),
                                                   (0, 136, True, torch.int32)):
            flat = torch.randn(t * width + 8, generator=gen).to(torch.bfloat16)
            x = flat[offset:offset + t * width].view(t, width)[:, :128]
            ids = torch.randint(0, 8, (t, 2), generator=gen).to(ids_dtype)
            rw = torch.rand(t, 2, generator=gen) if weighted else None
            y = kernel.forward(x, ids, w, topk_weights=rw)
            assert y.shape == ((t, 128) if weighted else (t, 2, 128))
    gemms = [r for r in recorded if r.fn.__name__ == "moe_w8a16_kernel"]
    assert {r.constexprs["SCHEDULED"] for r in gemms} == {False, True}
    assert_fixed_arguments_specialise_alike(recorded)
    before = len(recorded)
    kernel.forward(torch.randn(3, 128).bfloat16(), torch.zeros(3, 2, dtype=torch.int32), w)
    assert len(recorded) == before  # the bucket of (3 × 2 routes) was kept


@pytest.mark.parametrize("planning", ["interpreter", "gpu"])
def test_calls_share_a_bucket_only_where_the_tile_and_the_route_bound_agree(
    monkeypatch: pytest.MonkeyPatch, planning: str,
) -> None:
    """A call's bucket is its route count's index among the weight's route points: every
    route count of one index gets the same tile and the same compile-time route bound."""
    interpreted = planning == "interpreter"
    monkeypatch.setattr(kernel_mod, "interpreted", lambda: interpreted)
    monkeypatch.setattr(kernel_mod, "_facts", lambda device: (None if interpreted else H100_SXM, 132))
    _, w = _weights()
    points, card = kernel_mod._route_points(w, torch.device("cpu"))
    made: dict[int, tuple[MoETile, int]] = {}
    for routes in range(1, 6000):
        tile = pick_tile(routes, 8, 128, 64, scale_dtype=w.scales.dtype, card=card, interpreted=interpreted)
        fixed = (tile, pow2_at_least(routes, 16))
        assert made.setdefault(bisect.bisect_left(points, routes), fixed) == fixed, routes
    assert len({t for t, _ in made.values()}) > (1 if interpreted else 2)  # the tile did change on the way


def test_route_weights_vary_only_in_a_weighted_bucket(recorded: list[Recorder]) -> None:
    kernel, w = _weights()
    x, ids = torch.randn(2, 128).bfloat16(), torch.zeros(2, 2, dtype=torch.int32)
    kernel.forward(x, ids, w)
    kernel.forward(x, ids, w, topk_weights=torch.rand(2, 2))
    plain, weighted = recorded
    pos = triton_launch.GEMM_ROUTE_WEIGHTS
    assert pos in plain.fixed_pointers and pos not in plain.varying and plain.calls[0][1][pos] is w.scales
    assert pos in weighted.varying and pos not in weighted.fixed_pointers


def test_another_prepared_state_is_bound_anew(recorded: list[Recorder]) -> None:
    kernel, w = _weights()
    x, ids = torch.randn(2, 128).bfloat16(), torch.zeros(2, 2, dtype=torch.int32)
    kernel.forward(x, ids, w)
    kernel.forward(x, ids, w)
    kernel.forward(x, ids, dataclasses.replace(w))  # the custom op rebuilds the state around the same tensors
    assert len(recorded) == 1 and len(recorded[0].calls) == 3
    kernel.forward(x, ids, dataclasses.replace(w, scales=w.scales.clone()))
    assert len(recorded) == 2  # other scales: bound anew
    _, other = _weights()
    kernel.forward(x, ids, other)
    assert len(recorded) == 3 and recorded[2].calls[0][1][3].data_ptr() == other.layout.data_ptr()


def test_every_call_is_still_checked(recorded: list[Recorder]) -> None:
    kernel, w = _weights(e=4)
    x, ids = torch.randn(2, 128).bfloat16(), torch.zeros(2, 2, dtype=torch.int32)
    kernel(x, ids, w)
    with pytest.raises(KernelInputError, match="x: expected"):
        kernel(torch.randn(2, 64).bfloat16(), ids, w)
    with pytest.raises(KernelInputError, match="x: expected"):
        kernel(x.float(), ids, w)
    with pytest.raises(KernelInputError, match=r"x: expected .* on cpu, got .* on meta"):
        kernel(torch.empty(2, 128, dtype=torch.bfloat16, device="meta"), ids, w)
    with pytest.raises(KernelInputError, match=r"topk_ids: expected expert ids in \[0, 4\)"):
        kernel(x, torch.full((2, 2), 4, dtype=torch.int32), w)
    assert sum(len(r.calls) for r in recorded) == 1


def test_the_ids_are_read_on_the_host_only_off_cuda() -> None:
    assert reads_ids(torch.zeros(2, 2, dtype=torch.int32))  # a CPU tensor: no synchronisation to save
    assert not reads_ids(Mock(spec=torch.Tensor, is_cuda=True))
    assert reads_ids([[0, 1]])  # not a tensor: check_routing refuses it by name


@pytest.mark.parametrize(
    ("t", "ids_dtype", "rw_dtype", "ops"),
    [
        (1, torch.int32, None, ["empty"]),  # in-kernel routing: the output, one launch
        (16, torch.int64, None, ["empty"]),  # int64 ids go to the kernel as they are
        (3, torch.int32, torch.float32, ["empty", "sum", "_to_copy"]),  # the routes' weighted sum, rounded
        (150, torch.int64, None, ["empty"]),  # scheduled in one launch: the output
        (150, torch.int32, torch.bfloat16, ["empty", "_to_copy", "sum", "_to_copy"]),
        # 2200 routes (above ONE_LAUNCH_MAX_ROUTES): the scheduling kernel first, and its buffer
        (1100, torch.int64, None, ["empty", "empty"]),
        (1100, torch.int32, torch.bfloat16, ["empty", "_to_copy", "empty", "sum", "_to_copy"]),
    ],
)
def test_a_cuda_call_reads_no_ids_and_runs_only_its_allocations(
    recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch, t: int, ids_dtype: torch.dtype,
    rw_dtype: torch.dtype | None, ops: list[str],
) -> None:
    monkeypatch.setattr(kernel_mod, "interpreted", lambda: False)
    monkeypatch.setattr(kernel_mod, "_facts", lambda device: (H100_SXM, 132))
    monkeypatch.setattr(kernel_mod, "reads_ids", lambda ids: False)  # what CUDA ids get
    kernel, w = _weights()
    gen = torch.Generator().manual_seed(t)
    x = torch.randn(t, 128, generator=gen).bfloat16()
    ids = torch.randint(0, 8, (t, 2), generator=gen).to(ids_dtype)
    ids[0, 0] = 8  # out of range: not read, so not refused (the kernels give its route NaN)
    rw = torch.rand(t, 2, generator=gen).to(rw_dtype) if rw_dtype is not None else None
    kernel(x, ids, w, topk_weights=rw)  # the bucket's first call
    before = [len(r.calls) for r in recorded]
    with AtenOps() as seen:
        y = kernel(x, ids, w, topk_weights=rw)
    assert seen.ops == ops
    launched = [r.fn.__name__ for r, n in zip(recorded, before, strict=True) if len(r.calls) > n]
    two = t * 2 > ONE_LAUNCH_MAX_ROUTES
    assert launched == ["route_schedule_kernel", "moe_w8a16_kernel"] if two else launched == ["moe_w8a16_kernel"]
    assert y.shape == ((t, 128) if rw is not None else (t, 2, 128)) and y.dtype == torch.bfloat16
    with pytest.raises(KernelInputError, match="x: expected"):  # every other check stays
        kernel(x.float(), ids, w)
