"""quantcore.triton.buffers: buffers a launcher keeps between calls."""

from __future__ import annotations

import pytest
import torch

from quantcore.triton import buffers
from quantcore.triton.buffers import (
    KeptBuffers,
    capture_id,
    capturing,
    grown,
    kept_buffer,
    retired,
    stream_key,
)


def test_kept_buffer_is_zeroed_when_asked_on_the_cpu() -> None:
    buf = kept_buffer(4096, torch.int32, torch.device("cpu"), zero=True)
    assert buf.shape == (4096,) and buf.dtype == torch.int32 and not bool(buf.any())
    assert not capturing(torch.device("cpu"))


def test_a_kept_buffer_grows_and_retires_the_outgrown_one() -> None:
    cpu = torch.device("cpu")
    store: dict[object, torch.Tensor] = {}
    first = grown(store, "k", 100, torch.int32, cpu, zero=True, minimum=1024)
    assert first.numel() == 1024 and store["k"] is first and not bool(first.any())
    before = retired()
    assert grown(store, "k", 1000, torch.int32, cpu, zero=True, minimum=1024) is first  # fits: the same one
    bigger = grown(store, "k", 1500, torch.int32, cpu, zero=True, minimum=1024, doubling=True)
    assert bigger.numel() == 2048 and store["k"] is bigger  # twice the old one, more than asked
    assert retired() == before + 1  # the outgrown one stays allocated
    exact = grown(store, "other", 1500, torch.float16, cpu, zero=False)
    assert exact.numel() == 1500 and exact.dtype == torch.float16


def test_kept_buffers_by_key_and_dtype() -> None:
    cpu = torch.device("cpu")
    scratch = KeptBuffers(None, zero=False)
    a = scratch.get((cpu, torch.float16), 64, cpu, torch.float16)
    assert a.dtype == torch.float16 and scratch.get((cpu, torch.float16), 32, cpu, torch.float16) is a
    assert scratch.get((cpu, torch.float32), 32, cpu, torch.float32).dtype == torch.float32
    with pytest.raises(TypeError, match="pass dtype="):
        scratch.get("no dtype", 8, cpu)
    assert stream_key(cpu) == ("cpu", 0)


def test_a_capture_is_handed_one_buffer_per_key_and_a_new_capture_another(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert capture_id(cpu) is None  # not capturing
    ident = [11]
    monkeypatch.setattr(buffers, "capturing", lambda device: True)
    monkeypatch.setattr(buffers, "capture_id", lambda device: ident[0])
    store: dict[object, torch.Tensor] = {}
    first = grown(store, "tickets", 64, torch.int32, cpu, zero=True)
    assert not bool(first.any()) and store == {}  # the graph's own: never kept in the store
    first += 3  # a launch inside the graph would leave them at zero; the same object is what counts
    assert grown(store, "tickets", 32, torch.int32, cpu, zero=True) is first, "zeroed once per capture, not per launch"
    assert grown(store, "other", 32, torch.int32, cpu, zero=True) is not first
    bigger = grown(store, "tickets", 128, torch.int32, cpu, zero=True)
    assert bigger is not first and bigger.numel() == 128 and not bool(bigger.any())
    ident[0] = 12  # the next graph
    fresh = grown(store, "tickets", 32, torch.int32, cpu, zero=True)
    assert fresh is not bigger and not bool(fresh.any())
    monkeypatch.setattr(buffers, "capture_id", lambda device: None)  # a capture the driver cannot name
    assert grown(store, "tickets", 32, torch.int32, cpu, zero=True) is not grown(store, "tickets", 32, torch.int32,
                                                                                 cpu, zero=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_capture_zeroes_a_grown_buffer_once() -> None:
    device = torch.device("cuda")
    store: dict[object, torch.Tensor] = {}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ident = capture_id(device)
        first = grown(store, "k", 16, torch.int32, device, zero=True)
        again = grown(store, "k", 16, torch.int32, device, zero=True)
    assert ident is not None and again is first and store == {}
    other = torch.cuda.CUDAGraph()
    with torch.cuda.graph(other):
        assert capture_id(device) not in (None, ident)
        assert grown(store, "k", 16, torch.int32, device, zero=True) is not first


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_buffer_kept_during_a_graph_capture_belongs_to_that_graph() -> None:
    device = torch.device("cuda")
    kept = kept_buffer(1024, torch.int32, device, zero=True)
    assert not bool(kept.any()) and not capturing(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assert capturing(device)
        inside = kept_buffer(8, torch.int32, device, zero=True)
        inside += 1
    graph.replay()
    torch.cuda.synchronize()
    assert inside.tolist() == [1] * 8  # zeroed by the graph itself at every replay
    graph.replay()
    torch.cuda.synchronize()
    assert inside.tolist() == [1] * 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_buffer_grown_during_a_capture_is_not_kept() -> None:
    device = torch.device("cuda")
    store: dict[object, torch.Tensor] = {}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grown(store, "k", 16, torch.int32, device, zero=True)
    assert store == {}
