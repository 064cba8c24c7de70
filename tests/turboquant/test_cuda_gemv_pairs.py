"""What only a GPU can show of the decode kernel's paired lookups (``pairs.py``): the float32
pair table gives exactly the output of the single-centroid lookup (the same centroids, the
same products in the same order), the fp16 pair table the golden output within the
conformance tolerance and within 2⁻¹⁰ of the single lookup's — at d = 128 and 64, one pass
and two, a rotation per layer or per group, bf16 and fp16, with a running partial, call
after call and replayed from a CUDA graph; and the launch that needs more than 48 KB of
shared memory a block (32 KB of table beside the kernel's own) runs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.formats.turboquant import TurboQuant
from quantcore.ops.linear import linear_reference
from tests.turboquant.cuda_layers import DTYPES, FORMATS, cuda_layer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

K, N = 2048, 600  # N: a ragged last row chunk


def _layer(fmt: TurboQuant, dtype: torch.dtype, seed: int) -> tuple[dict[str, torch.Tensor], Any]:
    return cuda_layer(fmt, N, K, dtype, seed)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.slug)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("geometry", [dict(gpc=8, ctas=264, br=16, warps=8, unroll=1),
                                      dict(gpc=8, ctas=396, br=8, warps=8, unroll=3),
                                      dict(gpc=4, ctas=66, br=8, warps=4, unroll=1)], ids=["br16", "br8u3", "w4"])
@pytest.mark.parametrize("lookup", ["pairs", "half_pairs"])
def test_paired_lookups_against_the_single_lookup_and_the_golden(fmt: TurboQuant, dtype: torch.dtype,
                                                                 geometry: dict[str, int], lookup: str) -> None:
    from quantcore.backends.turboquant_triton.configs import GemvConfig
    from quantcore.backends.turboquant_triton.fused import fused_linear

    t, prep = _layer(fmt, dtype, seed=7)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(1, K, generator=gen).to(dtype).cuda()
    partial = torch.randn(1, N, generator=gen).cuda()
    single = GemvConfig(**geometry)
    paired = dataclasses.replace(single, lookup=lookup)

    def run(cfg: GemvConfig) -> torch.Tensor:
        return fused_linear(x, prep.passes, prep.codebook, group_size=fmt.group_size, partial=partial,
                            bias=prep.bias, out_dtype=torch.float32, path="gemv", config=cfg)

    want, got = run(single), run(paired)
    assert torch.equal(run(paired), got)  # the second call finds the split-K tickets reset
    if lookup == "pairs":
        assert torch.equal(got, want)
    else:
        assert float((got - want).norm() / want.norm()) <= 2.0**-10
    ref = linear_reference(x.cpu(), fmt.dequantize(t), t["bias"]) + partial.cpu().double()
    assert compare(got.cpu().to(dtype), ref, tolerance_for(dtype)).ok

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(paired)
    x.copy_(torch.randn(1, K, generator=gen).to(dtype))
    graph.replay()
    assert torch.equal(captured, run(paired))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="programmatic dependent launch needs sm_90")
@pytest.mark.parametrize("lookup", ["single", "pairs"])
def test_dependent_launches_read_the_previous_layers_output(lookup: str) -> None:
    """``pdl``: each decode launch may start while the one before finishes and reads x only
    after waiting for it. Four layers chained (each reads the output the one before wrote),
    eagerly and replayed from a CUDA graph, give exactly the chain without it; with a wait
    missing a layer would read its input before it was written."""
    from quantcore.backends.turboquant_triton.configs import GemvConfig
    from quantcore.backends.turboquant_triton.fused import fused_linear

    width = 2048
    fmt = TurboQuant(group_size=128, residual=True)
    layers = [cuda_layer(fmt, width, width, torch.bfloat16, seed=20 + i)[1] for i in range(4)]
    plain = GemvConfig(gpc=8, ctas=264, br=8, warps=8, unroll=1, lookup=lookup)
    chained = dataclasses.replace(plain, pdl=True)
    x = torch.randn(1, width, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).cuda()

    def chain(cfg: GemvConfig) -> torch.Tensor:
        y = x
        for prep in layers:
            y = fused_linear(y, prep.passes, prep.codebook, group_size=128, partial=None, bias=prep.bias,
                             out_dtype=torch.bfloat16, path="gemv", config=cfg)
        return y

    want = chain(plain)
    assert torch.isfinite(want).all()
    assert torch.equal(chain(chained), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = chain(chained)
    for _ in range(3):
        x.copy_(torch.randn(1, width, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16))
        graph.replay()
        assert torch.equal(captured, chain(plain))
