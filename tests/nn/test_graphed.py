"""``GraphedEager`` without a GPU: its row buckets, what runs the module itself, and —
with the capture replaced by a stand-in that replays the module on the static input —
padding, the rows returned, one capture per bucket and a capture again after the
prepared state changes. ``tests/cuda/test_graphed_cuda.py`` replays real graphs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from quantcore.errors import InvalidArgumentError, KernelInputError, QuantCoreWarning
from quantcore.formats.gptq import GPTQ
from quantcore.nn import graphed
from quantcore.nn.graphed import GraphedEager, _Captured, graph_submodules, row_bucket
from quantcore.nn.linear import QuantLinear


class _Block(nn.Module):
    """Row-wise: a quantized linear, then a SiLU."""

    def __init__(self) -> None:
        super().__init__()
        fmt = GPTQ(bits=4, group_size=32)
        w = torch.randn(48, 64, generator=torch.Generator().manual_seed(0)) * 0.1
        self.linear = QuantLinear(fmt, fmt.quantize(w), device="cpu", dtype=torch.float32)
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(x.shape[0])
        return torch.nn.functional.silu(self.linear(x))


class _Replay:
    """Stands in for a captured graph: replaying runs the block on the static input into
    the static output, as the graph's kernels would."""

    def __init__(self, block: nn.Module, x: torch.Tensor, out: torch.Tensor) -> None:
        self.block, self.x, self.out = block, x, out

    def replay(self) -> None:
        self.out.copy_(self.block(self.x))


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor counts as graphable, and a capture is the stand-in above."""
    monkeypatch.setattr(GraphedEager, "graphed", lambda self, x: 0 < x.numel() // x.shape[-1] <= self.max_rows)

    def capture(self: GraphedEager, rows: int, x: torch.Tensor) -> _Captured:
        static_x = torch.full((rows, *x.shape[1:]), float("nan"), dtype=x.dtype)  # stale rows: anything
        out = torch.empty(rows, self.inner.linear.out_features)
        self.captures += 1
        return _Captured(_Replay(self.inner, static_x, out), static_x, out)  # type: ignore[arg-type]

    monkeypatch.setattr(GraphedEager, "_capture", capture)


def test_rows_are_padded_to_the_next_power_of_two() -> None:
    assert [row_bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 16, 17, 100)] == [1, 2, 4, 4, 8, 8, 16, 16, 32, 128]


@pytest.mark.parametrize("bad", [0, -1, 5000, 2.0, True, "16"])
def test_max_rows_is_checked(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="GraphedEager max_rows"):
        GraphedEager(nn.Identity(), max_rows=bad)


def test_a_cpu_call_runs_the_module_itself() -> None:
    block = _Block()
    wrapped = GraphedEager(block, max_rows=8)
    x = torch.randn(3, 64)
    assert not wrapped.graphed(x)
    assert torch.equal(wrapped(x), block(x)) and wrapped.captures == 0


def test_replays_return_the_rows_of_the_call_and_capture_once_a_bucket(stand_in: None) -> None:
    block = _Block()
    wrapped = GraphedEager(block, max_rows=8)
    gen = torch.Generator().manual_seed(1)
    for m in (3, 4, 1, 3, 7, 8, 1):
        x = torch.randn(m, 64, generator=gen)
        y = wrapped(x)
        # What the block gives these rows at the bucket's row count (a kernel may plan by M),
        # whatever the other rows hold: the padding (NaN, then stale rows) reaches none of them.
        padded = torch.cat([x, torch.zeros(row_bucket(m) - m, 64)])
        assert y.shape == (m, 48) and torch.equal(y, block(padded)[:m]), m
        torch.testing.assert_close(y, block(x))
    assert wrapped.captures == 3  # buckets 4, 1 and 8
    x = torch.randn(9, 64, generator=gen)  # over max_rows: the module itself
    before = wrapped.captures
    assert torch.equal(wrapped(x), block(x)) and wrapped.captures == before


def test_each_stream_replays_its_own_graphs(stand_in: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two streams (here a stand-in for the current stream's key) capture a bucket each and
    keep to their own static tensors, so calls on both at once could not overwrite each
    other's input; returning to a stream replays its graph without capturing again."""
    stream = ["a"]
    monkeypatch.setattr(graphed, "stream_key", lambda device: stream[0])
    block = _Block()
    wrapped = GraphedEager(block, max_rows=4)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(wrapped(x), block(x))
    stream[0] = "b"
    torch.testing.assert_close(wrapped(x), block(x))
    assert wrapped.captures == 2
    (on_a, on_b) = wrapped._graphs.values()
    assert on_a.x is not on_b.x and on_a.out is not on_b.out
    stream[0] = "a"
    torch.testing.assert_close(wrapped(x), block(x))
    assert wrapped.captures == 2


def test_a_new_prepared_state_is_captured_again(stand_in: None) -> None:
    block = _Block()
    wrapped = GraphedEager(block, max_rows=4)
    x = torch.randn(2, 64)
    wrapped(x)
    wrapped(x)
    assert wrapped.captures == 1
    block.linear.load_state_dict(block.linear.state_dict())  # a load makes a new prepared state
    assert torch.equal(wrapped(x), block(x)) and wrapped.captures == 2
    wrapped.reset()
    wrapped(x)
    assert wrapped.captures == 3


def test_a_bucket_that_cannot_be_captured_runs_eagerly_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    block = _Block()
    wrapped = GraphedEager(block, max_rows=4)
    monkeypatch.setattr(GraphedEager, "graphed", lambda self, x: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    tried: list[int] = []

    def refuse(self: GraphedEager, rows: int, x: torch.Tensor) -> _Captured:
        tried.append(rows)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(GraphedEager, "_capture", refuse)
    x = torch.randn(3, 64)
    with pytest.warns(QuantCoreWarning, match="cannot be captured at 4 rows.*not permitted"):
        assert torch.equal(wrapped(x), block(x))
    assert torch.equal(wrapped(x), block(x)) and tried == [4]  # refused once, not tried again


def test_a_bad_input_is_the_callers_error_not_a_refused_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    wrapped = GraphedEager(_Block(), max_rows=4)
    monkeypatch.setattr(GraphedEager, "graphed", lambda self, x: True)
    # A capture warms the module up on the call's rows first, as the real one does.
    monkeypatch.setattr(GraphedEager, "_capture", lambda self, rows, x: self.inner(x))
    with pytest.raises(KernelInputError, match="x"):
        wrapped(torch.randn(2, 63))  # K = 63, the linear takes 64
    assert not wrapped._refused


def test_autograd_and_tracing_run_the_module_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    wrapped = GraphedEager(_Block(), max_rows=4)
    x = torch.randn(2, 64)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert wrapped.graphed(x)
    assert not wrapped.graphed(x.clone().requires_grad_())
    with torch.no_grad():
        assert wrapped.graphed(x.clone().requires_grad_())
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert not wrapped.graphed(x)


def test_leading_dims_are_rows(stand_in: None) -> None:
    block = _Block()
    wrapped = GraphedEager(block, max_rows=8)
    x = torch.randn(2, 3, 64)  # [B, T, H]: 6 rows, bucket 8
    y = wrapped(x)
    assert y.shape == (2, 3, 48) and wrapped.captures == 1
    torch.testing.assert_close(y, block(x))
    assert not wrapped.graphed(torch.randn(3, 3, 64))  # 9 rows: over max_rows


def test_graph_submodules_wraps_the_named_blocks_once() -> None:
    model = nn.ModuleDict({"layers": nn.ModuleList([nn.ModuleDict({"mlp": _Block(), "attn": nn.Identity()})
                                                     for _ in range(2)])})
    assert graph_submodules(model, max_rows=4) == ["layers.0.mlp", "layers.1.mlp"]
    assert all(isinstance(layer["mlp"], GraphedEager) and layer["mlp"].max_rows == 4 for layer in model["layers"])
    assert not isinstance(model["layers"][0]["attn"], GraphedEager)
    assert graph_submodules(model) == []  # already wrapped


def test_the_module_is_exported_where_the_modules_are() -> None:
    assert graphed.__all__ == ["GraphedEager", "graph_submodules", "row_bucket"]
