"""aten_cpu under torch.compile: one graph, the same bits as eager."""

from __future__ import annotations

import torch

import quantcore
from quantcore.formats.gptq import GPTQ


def test_aten_cpu_compiles_fullgraph() -> None:
    fmt = GPTQ(group_size=32, sym=False, desc_act=True)
    gen = torch.Generator().manual_seed(0)
    tensors = fmt.quantize(torch.randn(64, 256, generator=gen), generator=gen)
    problem = quantcore.Problem.linear(fmt, M=4, K=256, N=64, dtype=torch.bfloat16)
    k = quantcore.get_kernel(fmt, "cpu", problem=problem)
    prepared = k.prepare(tensors, dtype=torch.bfloat16)
    x = torch.randn(4, 256, generator=gen).bfloat16()
    compiled = torch.compile(lambda x: k(x, prepared), fullgraph=True)
    assert torch.equal(compiled(x), k(x, prepared))
