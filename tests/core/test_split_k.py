"""quantcore.triton.split_k: the buffers of a deterministic split-K launch."""

from __future__ import annotations

import torch

from quantcore.triton.split_k import SplitKBuffers, split_k_counters


def test_an_unsplit_launch_gets_the_stand_in_for_both() -> None:
    unused = torch.randn(3)
    runtime: dict[object, torch.Tensor] = {}
    ws, counters = SplitKBuffers(1, torch.device("cpu"), unused)(runtime, 5, 7, 2)
    assert ws is unused and counters is unused and not runtime  # nothing allocated, nothing kept


def test_a_split_launch_gets_a_workspace_per_call_and_kept_zeroed_counters() -> None:
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
