"""``GraphedEager`` on a CUDA device: a GPTQ MLP block (gate/up fused, the gated
activation, down) replayed from real CUDA graphs at several M, each call equal bit for bit
to the block run on the bucket's rows, one capture per bucket, and the block itself past
``max_rows``. Skipped without a GPU."""

from __future__ import annotations

import torch

from quantcore.checkpoint.parallel import ParallelQuantMLP, TPGroup
from quantcore.formats.gptq import GPTQ
from quantcore.nn.graphed import GraphedEager, row_bucket
from tests.compiled_cuda import skip_unless_compiled_cuda

skip_unless_compiled_cuda()

HIDDEN, INTER = 512, 1024


def _block() -> ParallelQuantMLP:
    fmt = GPTQ(bits=4, group_size=128)
    gen = torch.Generator().manual_seed(0)
    layers = {name: fmt.quantize(torch.randn(n, k, generator=gen) * 0.05)
              for name, (n, k) in {"gate": (INTER, HIDDEN), "up": (INTER, HIDDEN), "down": (HIDDEN, INTER)}.items()}
    return ParallelQuantMLP(fmt, layers, TPGroup(0, 1), device="cuda", dtype=torch.bfloat16)


def test_graphed_calls_equal_the_block_on_the_bucket_rows() -> None:
    block = _block()
    wrapped = GraphedEager(block, max_rows=16)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in (1, 3, 4, 16, 3, 1, 9):
            x = torch.randn(m, HIDDEN, generator=gen).to("cuda", torch.bfloat16)
            y = wrapped(x)
            padded = torch.cat([x, torch.zeros(row_bucket(m) - m, HIDDEN, device="cuda", dtype=x.dtype)])
            assert torch.equal(y, block(padded)[:m]), m
        assert wrapped.captures == 3  # buckets 1, 4 and 16
        before = wrapped.captures
        x = torch.randn(17, HIDDEN, generator=gen).to("cuda", torch.bfloat16)
        assert torch.equal(wrapped(x), block(x)) and wrapped.captures == before
