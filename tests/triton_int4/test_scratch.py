"""triton_int4's dequantization scratch (the dense weight of the dequantize + cuBLAS path):
on CUDA one kept buffer per stream and dtype, never shared by two streams (two
micro-batches' prefill at once must not overwrite each other's weight); on a CPU, where the
interpreter may run calls on two threads, a call's own."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from quantcore.backends.triton_int4.launch import _scratch_for


def test_a_cpu_call_gets_its_own_scratch() -> None:
    cpu = torch.device("cpu")
    a, b = _scratch_for(cpu, torch.bfloat16, 64), _scratch_for(cpu, torch.bfloat16, 64)
    assert a.numel() == 64 and a.dtype == torch.bfloat16 and a.data_ptr() != b.data_ptr()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kept scratch is CUDA's")
def test_a_cuda_stream_keeps_its_own_scratch() -> None:
    dev = torch.device("cuda")
    here = _scratch_for(dev, torch.bfloat16, 1 << 12)
    assert here.numel() == 1 << 12 and _scratch_for(dev, torch.bfloat16, 1 << 10).data_ptr() == here.data_ptr()
    assert _scratch_for(dev, torch.float16, 1 << 10).data_ptr() != here.data_ptr()
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        assert _scratch_for(dev, torch.bfloat16, 1 << 10).data_ptr() != here.data_ptr()
