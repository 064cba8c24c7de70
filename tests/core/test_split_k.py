"""quantcore.triton.split_k: the buffers of a deterministic split-K launch."""

from __future__ import annotations

import pytest
import torch

from quantcore.triton.split_k import SplitKBuffers


def test_an_unsplit_launch_gets_the_stand_in_for_both() -> None:
    unused = torch.randn(3)
    ws, counters = SplitKBuffers(1, torch.device("cpu"), unused)(5, 7, 2)
    assert ws is unused and counters is unused


def test_a_cpu_launch_gets_its_own_workspace_and_zeroed_counters() -> None:
    """On a CPU (the interpreter may run launches on two threads) every call makes its own."""
    buffers = SplitKBuffers(3, torch.device("cpu"), torch.randn(3))
    ws, counters = buffers(5, 7, 2)
    assert ws.dtype == torch.float32 and ws.numel() == 3 * 5 * 7
    assert counters.dtype == torch.int32 and counters.numel() == 2 and not bool(counters.any())
    ws2, counters2 = buffers(4, 7, 2)
    assert ws2.numel() == 3 * 4 * 7 and ws2.data_ptr() != ws.data_ptr() and counters2.data_ptr() != counters.data_ptr()


def test_kept_buffers_are_per_stream_and_shared_by_launches_there() -> None:
    """The kept path (CUDA's), forced on a CPU device, whose one "stream" is its name:
    every launch there gets the same pair, at least as large as asked, the counters zeroed;
    a larger launch grows them, and a launch bound before keeps its pair, which still fits."""
    cpu = torch.device("cpu")
    first = SplitKBuffers(3, cpu, torch.randn(3))
    first.keeps = True
    ws, counters = first(5, 7, 2)
    assert ws.numel() >= 3 * 5 * 7 and counters.numel() >= 1024 and not bool(counters.any())
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(first(4, 7, 2), (ws, counters), strict=True))
    other = SplitKBuffers(2, cpu, torch.randn(3))
    other.keeps = True
    assert other(5, 7, 2)[0].data_ptr() == ws.data_ptr()
    grown_ws, grown_counters = other(5000, 7, 4000)
    assert grown_ws.numel() >= 2 * 5000 * 7 and grown_counters.numel() >= 4000
    assert grown_ws.data_ptr() != ws.data_ptr()
    assert first(5, 7, 2)[0].data_ptr() == ws.data_ptr()


def test_a_stream_whose_calls_grow_row_by_row_retires_few_buffers() -> None:
    """Kept buffers are never freed once outgrown (a captured graph may still use them), so
    they double: 2,000 calls of 1, 2, 3 … rows retire a handful, not one a row (which would
    keep on the order of the square of the largest workspace)."""
    from quantcore.triton.buffers import retired

    cpu = torch.device("cpu")
    buffers = SplitKBuffers(4, cpu, torch.randn(3))
    buffers.keeps = True
    before = retired()
    for m in range(1, 2001):
        ws, counters = buffers(m, 1024, m)
        assert ws.numel() >= 4 * m * 1024 and counters.numel() >= m
    assert retired() - before <= 16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kept buffers are CUDA's (a CPU call makes its own)")
def test_a_cuda_launch_takes_its_streams_kept_buffers() -> None:
    """On CUDA a call allocates nothing: every split-K launch on a stream gets that
    stream's kept workspace and counters, another stream others (the same layer on two
    streams at once must not count its arrivals together), and a graph being captured its
    own, not remembered for eager calls."""
    dev = torch.device("cuda")
    buffers = SplitKBuffers(3, dev, torch.randn(3, device=dev))
    ws, counters = buffers(5, 7, 2)
    assert ws.dtype == torch.float32 and ws.numel() >= 3 * 5 * 7 and not bool(counters.any())
    assert [t.data_ptr() for t in buffers(4, 7, 2)] == [ws.data_ptr(), counters.data_ptr()]
    other_layer = SplitKBuffers(2, dev, torch.randn(3, device=dev))
    assert other_layer(5, 7, 2)[1].data_ptr() == counters.data_ptr()  # one pair per stream
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        side_ws, side_counters = buffers(5, 7, 2)
    assert side_ws.data_ptr() != ws.data_ptr() and side_counters.data_ptr() != counters.data_ptr()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = buffers(5, 7, 2)
    assert captured[1].data_ptr() not in (counters.data_ptr(), side_counters.data_ptr())
    assert buffers(5, 7, 2)[1].data_ptr() == counters.data_ptr()
