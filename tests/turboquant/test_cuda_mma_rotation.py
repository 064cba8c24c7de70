"""What only a GPU can show of the tensor-core kernel rotating x itself (``mma.py``,
``ROTATE``, and once per call by its first programs, ``ROTATE_ONCE``): the compiled dot on
16-bit operands (the interpreter feeds it float32) against the golden output and against
the rotation GEMM outside, at d = 128 and 64, one pass and two, the passes' own rotations
or one shared, one split and several, with and without a running partial; the rotation
programs and the output tiles of one launch meeting on the GPU's schedule (the
interpreter runs them in order); and a CUDA graph that replays each with the split-K
tickets and the counts reset."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.formats.turboquant import TurboQuant
from quantcore.ops.linear import linear_reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

K, N = 1024, 200  # N: a ragged last row tile


def _layer(fmt: TurboQuant, shared: bool, seed: int) -> tuple[dict[str, torch.Tensor], Any]:
    from quantcore.backends.turboquant_triton import TurboQuantTriton

    gen = torch.Generator().manual_seed(seed)
    t = fmt.quantize(torch.randn(N, K, generator=gen) * 0.05, generator=gen)
    t["bias"] = torch.randn(N, generator=gen)
    if shared:
        t["residual_rotation"] = t["rotation"].clone()
    prep = TurboQuantTriton(fmt, "cuda").prepare({k: v.cuda() for k, v in t.items()}, dtype=torch.bfloat16)
    if shared:
        p1, p2 = prep.passes
        prep = dataclasses.replace(prep, passes=(p1, dataclasses.replace(p2, rotation=p1.rotation)))
    return t, prep


def _call(prep: Any, x: torch.Tensor, d: int, block_m: int, gpc: int, in_kernel: bool,
          partial: torch.Tensor | None = None, once: bool = False) -> torch.Tensor:
    from quantcore.backends.turboquant_triton.configs import MmaConfig
    from quantcore.backends.turboquant_triton.fused import fused_linear

    cfg = MmaConfig(block_n=64, block_m=block_m, gpc=gpc, ctas=1000, rotate_in_kernel=in_kernel, rotate_once=once)
    return fused_linear(x, prep.passes, prep.codebook, group_size=d, partial=partial, bias=prep.bias,
                        out_dtype=torch.bfloat16, path="mma", config=cfg)


LAYERS = [
    pytest.param(TurboQuant(group_size=128), False, id="one-pass"),
    pytest.param(TurboQuant(group_size=128, residual=True), False, id="own-rotations"),
    pytest.param(TurboQuant(group_size=128, residual=True), True, id="shared-rotation"),
    pytest.param(TurboQuant(group_size=64, residual=True), False, id="own-rotations-g64"),
]


@pytest.mark.parametrize("m", [1, 5, 16, 33, 128])
@pytest.mark.parametrize(("fmt", "shared"), LAYERS)
def test_cuda_in_kernel_rotation_matches_golden_and_outside(fmt: TurboQuant, shared: bool, m: int) -> None:
    t, prep = _layer(fmt, shared, seed=m)
    d = fmt.group_size
    gen = torch.Generator().manual_seed(1000 + m)
    x = torch.randn(m, K, generator=gen).to(torch.bfloat16)
    partial = torch.randn(m, N, generator=gen)
    ref = linear_reference(x, fmt.dequantize(t), t["bias"])
    block_m = 16 if m <= 16 else 64
    tol = tolerance_for(torch.bfloat16)
    for gpc in (K // d, 3):  # one split; several, the last ragged
        ys = {flag: _call(prep, x.cuda(), d, block_m, gpc, flag) for flag in (True, False)}
        for flag, y in ys.items():
            result = compare(y, ref, tol)
            assert result.ok, f"in_kernel={flag} gpc={gpc}: {result.problem}"
        result = compare(ys[True], ys[False].double().cpu(), tol)
        assert result.ok, f"in-kernel vs outside, gpc={gpc}: {result.problem}"
        y = _call(prep, x.cuda(), d, block_m, gpc, True, partial.cuda())
        result = compare(y, ref + partial.double(), tol)
        assert result.ok, f"with partial, gpc={gpc}: {result.problem}"


@pytest.mark.parametrize("gpc", [8, 3])
@pytest.mark.parametrize(("rows", "seed", "in_kernel", "once"), [(16, 5, True, False), (40, 7, False, True)],
                         ids=["in-kernel", "once"])
def test_cuda_graph_replays_the_rotation_in_the_launch(gpc: int, rows: int, seed: int, in_kernel: bool,
                                                       once: bool) -> None:
    """Replayed from a CUDA graph, a launch that rotates x itself gives the bits of an
    eager call (in-kernel: split partials added in split order; once: the counts reset)."""
    fmt = TurboQuant(group_size=128, residual=True)
    _, prep = _layer(fmt, False, seed=seed)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    x = torch.randn(rows, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    _call(prep, x, 128, 16, gpc, in_kernel, once=once)  # bucket, kept buffers and binary made outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = _call(prep, x, 128, 16, gpc, in_kernel, once=once)
    for _ in range(3):
        x.copy_(torch.randn(rows, K, device="cuda", dtype=torch.bfloat16, generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, _call(prep, x, 128, 16, gpc, in_kernel, once=once))


@pytest.mark.parametrize("m", [1, 16, 33, 128])
@pytest.mark.parametrize(("fmt", "shared"), LAYERS)
def test_cuda_rotation_once_matches_golden_and_outside(fmt: TurboQuant, shared: bool, m: int) -> None:
    t, prep = _layer(fmt, shared, seed=2000 + m)
    d = fmt.group_size
    gen = torch.Generator().manual_seed(3000 + m)
    x = torch.randn(m, K, generator=gen).to(torch.bfloat16).cuda()
    partial = torch.randn(m, N, generator=gen)
    ref = linear_reference(x.cpu(), fmt.dequantize(t), t["bias"])
    block_m = 16 if m <= 16 else 64
    tol = tolerance_for(torch.bfloat16)
    for gpc in (K // d, 3):  # one split; several, the last ragged
        once = _call(prep, x, d, block_m, gpc, False, once=True)
        for what, other in (("golden", ref), ("outside", _call(prep, x, d, block_m, gpc, False).double().cpu())):
            result = compare(once, other, tol)
            assert result.ok, f"once vs {what}, gpc={gpc}: {result.problem}"
        for _ in range(3):  # the counts reset: the same bits call after call
            assert torch.equal(_call(prep, x, d, block_m, gpc, False, once=True), once)
        y = _call(prep, x, d, block_m, gpc, False, partial.cuda(), once=True)
        result = compare(y, ref + partial.double(), tol)
        assert result.ok, f"once with partial, gpc={gpc}: {result.problem}"


