"""quantcore.triton.split_k: the buffers of a deterministic split-K launch."""

from __future__ import annotations

import pytest
import torch

from quantcore.triton.split_k import SplitKBuffers, split_k_counters


def test_an_unsplit_launch_gets_the_stand_in_for_both() -> None:
    unused = torch.randn(3)
    runtime: dict[object, torch.Tensor] = {}
    ws, counters = SplitKBuffers(1, torch.device("cpu"), unused)(runtime, 5, 7, 2)
    assert ws is unused and counters is unused and not runtime  # nothing allocated, nothing kept


def test_a_split_launch_gets_a_workspace_per_call_and_kept_zeroed_counters() -> None:
    """On a CPU (the interpreter may run launches on two threads) a call makes its own workspace."""
    cpu = torch.device("cpu")
    runtime: dict[object, torch.Tensor] = {}
    buffers = SplitKBuffers(3, cpu, torch.randn(3))
    ws, counters = buffers(runtime, 5, 7, 2)
    assert ws.dtype == torch.float32 and ws.numel() == 3 * 5 * 7
    assert counters.dtype == torch.int32 and counters.numel() >= 2 and not bool(counters.any())
    assert runtime[("counters", cpu)] is counters and buffers.counters is counters
    ws2, again = buffers(runtime, 4, 7, 2)
    assert again is counters and ws2.numel() == 3 * 4 * 7 and ws2.data_ptr() != ws.data_ptr()
    more = buffers(runtime, 5, 7, 5000)[1]  # more tiles than the kept counters hold: grown
    assert more.numel() >= 5000 and runtime[("counters", cpu)] is more and buffers.counters is more
    assert split_k_counters(runtime, 100, cpu) is more


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kept workspace is CUDA's (a CPU call makes its own)")
def test_a_cuda_launch_takes_its_streams_kept_workspace() -> None:
    """On CUDA a call allocates no workspace: every split-K launch on a stream gets that
    stream's kept buffer (at least as large as asked), another stream another buffer, and
    a graph being captured one of its own that is not remembered for eager calls."""
    dev = torch.device("cuda")
    runtime: dict[object, torch.Tensor] = {}
    buffers = SplitKBuffers(3, dev, torch.randn(3, device=dev))
    ws = buffers(runtime, 5, 7, 2)[0]
    assert ws.dtype == torch.float32 and ws.numel() >= 3 * 5 * 7
    assert buffers(runtime, 4, 7, 2)[0].data_ptr() == ws.data_ptr()
    other_layer = SplitKBuffers(2, dev, torch.randn(3, device=dev))
    assert other_layer(runtime, 5, 7, 2)[0].data_ptr() == ws.data_ptr()  # one buffer per stream
    bigger = buffers(runtime, 5000, 7, 2)[0]
    assert bigger.numel() >= 3 * 5000 * 7
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        assert buffers(runtime, 5, 7, 2)[0].data_ptr() != bigger.data_ptr()
    graph = torch.cuda.CUDAGraph()
    eager = buffers(runtime, 5, 7, 2)[0]
    with torch.cuda.graph(graph):
        captured = buffers(runtime, 5, 7, 2)[0]
    assert captured.data_ptr() != eager.data_ptr()
    assert buffers(runtime, 5, 7, 2)[0].data_ptr() == eager.data_ptr()
