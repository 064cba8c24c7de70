"""quantcore.workspace: buffers a kernel keeps between calls."""

from __future__ import annotations

import pytest
import torch

from quantcore.workspace import capturing, kept_buffer


def test_kept_buffer_is_zeroed_when_asked_on_the_cpu() -> None:
    buf = kept_buffer(4096, torch.int32, torch.device("cpu"), zero=True)
    assert buf.shape == (4096,) and buf.dtype == torch.int32 and not bool(buf.any())
    assert not capturing(torch.device("cpu"))


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
