"""The kernel route's host work (quantcore/kernels/gated_activation/triton_launch.py), with
the launch recorded (no GPU): one bound launch per (activation, I, dtype, device), whatever
the row count, the shape or the row stride; a call is one output allocation and one launch
of ``(M, ⌈I / BLOCK⌉)`` programs over ``h`` as rows."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

pytest.importorskip("triton")

from quantcore.kernels.gated_activation import triton_launch
from quantcore.kernels.gated_activation.triton_source import gated_activation_kernel
from tests.aten_ops import ops_of_call
from tests.launch_recorder import Recorder, assert_fixed_arguments_specialise_alike, record_launches


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    monkeypatch.setattr(triton_launch, "_buckets", {})
    return record_launches(monkeypatch, triton_launch)


def test_block_and_warps_follow_the_row_length() -> None:
    assert triton_launch.block_of(7168) == (1024, 4)  # a rank's I: 8 columns a thread, 4 warps
    assert triton_launch.block_of(1100) == (1024, 4)
    assert triton_launch.block_of(300) == (512, 2)
    assert triton_launch.block_of(37) == (64, 1)
    assert triton_launch.block_of(3) == (16, 1)


def test_one_bound_launch_serves_every_row_count_shape_and_stride(recorded: list[Recorder]) -> None:
    inter = 1100
    buf = torch.randn(9, 2 * inter + 8).bfloat16()
    calls = [torch.randn(1, 2 * inter).bfloat16(), torch.randn(7, 2 * inter).bfloat16(),
             torch.randn(2, 3, 2 * inter).bfloat16(), buf[2:7, :2 * inter], torch.randn(2 * inter).bfloat16()]
    outs = [triton_launch.run(h, "silu") for h in calls]
    assert len(recorded) == 1
    launch = recorded[0]
    assert launch.fn is gated_activation_kernel and launch.device == torch.device("cpu")
    assert launch.constexprs == {"INTER": inter, "ACT": "silu", "BLOCK": 1024, "COMPILED": False}
    assert launch.options == {"num_warps": 4, "enable_fp_fusion": False}
    assert launch.varying == triton_launch.VARYING == (0, 1, 2)
    assert [grid for grid, _ in launch.calls] == [(1, 2, 1), (7, 2, 1), (6, 2, 1), (5, 2, 1), (1, 2, 1)]
    for h, out, (_, (rows, written, stride)) in zip(calls, outs, launch.calls, strict=True):
        assert out.shape == (*h.shape[:-1], inter) and out.dtype == h.dtype and out.is_contiguous()
        assert written is out
        assert rows.data_ptr() == h.data_ptr() and rows.stride(1) == 1 and stride == rows.stride(0)
    assert launch.calls[3][1][2] == 2 * inter + 8  # rows of a larger buffer: its row stride
    assert_fixed_arguments_specialise_alike(recorded)


def test_another_activation_size_dtype_is_another_bound_launch(recorded: list[Recorder]) -> None:
    h = torch.randn(2, 64).bfloat16()
    for _ in range(2):
        triton_launch.run(h, "silu")
        triton_launch.run(h, "gelu")
        triton_launch.run(h.half(), "silu")
        triton_launch.run(torch.randn(2, 96).bfloat16(), "silu")
    assert [(r.constexprs["ACT"], r.constexprs["INTER"]) for r in recorded] == [
        ("silu", 32), ("gelu", 32), ("silu", 32), ("silu", 48)]
    assert [len(r.calls) for r in recorded] == [2, 2, 2, 2]


@pytest.mark.parametrize(("shape", "ops"), [((4, 64), {"empty": 1}), ((2, 2, 64), {"empty": 1, "view": 1})])
def test_a_call_asks_for_its_output_and_nothing_else(recorded: list[Recorder], shape: tuple[int, ...],
                                                     ops: dict[str, int]) -> None:
    h = torch.randn(*shape).bfloat16()
    assert ops_of_call(lambda: triton_launch.run(h, "silu")) == Counter(ops)
    assert len(recorded[0].calls) == 2


def test_no_rows_or_no_columns_launch_nothing(recorded: list[Recorder]) -> None:
    assert triton_launch.run(torch.empty(0, 64), "silu").shape == (0, 32)
    assert triton_launch.run(torch.empty(3, 0), "silu").shape == (3, 0)
    assert all(not r.calls for r in recorded)
