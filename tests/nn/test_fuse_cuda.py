"""Fused projections on a CUDA device: a small Llama whose q/k/v and gate/up run as one
GPTQ or TurboQuant linear each, through the kernels ``get_kernel`` picks there, against
the unfused model and against the float reference of the same weights; then compiled by
inductor (``fullgraph=True``) and replayed from a CUDA graph. The kernels may tile a wider
N differently, so fused and unfused agree within bf16's rounding rather than bit for bit.
Skipped without a GPU (``bash tools/probes/model_decode_gpu.sh check``)."""

from __future__ import annotations

import pytest
import torch

from quantcore.formats.gptq import GPTQ
from quantcore.formats.turboquant import TurboQuant
from quantcore.nn.quant_module import QuantModule

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

#: Logits of a 2-layer bf16 model: bf16 arithmetic alone moves them by about 0.006
#: (relative L2) from float32 on the CPU kernels (the model_decode suite's tiny rows).
TOLERANCE = 0.02


def _dense() -> torch.nn.Module:
    from quantcore.benchmarks.decode import random_llama

    torch.manual_seed(0)
    dims = {"H": 256, "I": 512, "NH": 4, "NKV": 2, "V": 512, "L": 2, "P": 8, "T": 8}
    return random_llama(dims, "cuda", torch.bfloat16)


def _ids() -> torch.Tensor:
    return torch.randint(0, 512, (2, 8), generator=torch.Generator().manual_seed(1)).cuda()


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.float()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("fmt", [GPTQ(bits=4, group_size=128), TurboQuant(bits=4, group_size=128)], ids=lambda f: f.slug)
def test_fused_and_unfused_agree_and_stay_at_the_float_reference(fmt) -> None:
    from quantcore.benchmarks.decode import quantized_copy, reference_copy

    dense, ids = _dense(), _ids()
    fused = quantized_copy(dense, fmt, fuse=True)
    unfused = quantized_copy(dense, fmt, fuse=False)
    assert sum(isinstance(m, QuantModule) for m in fused.modules()) == 4 * 2
    kernels = sorted({m.kernel.name for m in fused.modules() if isinstance(m, QuantModule)})
    ref = _logits(reference_copy(dense, fmt, fuse=True), ids)
    got, apart = _logits(fused, ids), _logits(unfused, ids)
    print(f"\n{fmt.slug} fused on {kernels}: vs float reference {_rel(got, ref):.4f}, vs unfused {_rel(got, apart):.4f}"
          f" (bit for bit: {torch.equal(got, apart)})")
    assert _rel(got, ref) < TOLERANCE
    if isinstance(fmt, GPTQ):  # the same tensors fused or not (TurboQuant's fused rotations are drawn once per group)
        assert _rel(got, apart) < TOLERANCE


def test_the_fused_model_compiles_and_replays_from_a_cuda_graph() -> None:
    from quantcore.benchmarks.decode import quantized_copy

    model, ids = quantized_copy(_dense(), GPTQ(bits=4, group_size=128), fuse=True), _ids()
    eager = _logits(model, ids)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    assert _rel(_logits(compiled, ids), eager) < TOLERANCE
    static = ids.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(2):
            compiled(input_ids=static, use_cache=False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = compiled(input_ids=static, use_cache=False).logits
    other = torch.randint(0, 512, ids.shape, generator=torch.Generator().manual_seed(2)).cuda()
    static.copy_(other)
    graph.replay()
    torch.cuda.synchronize()
    assert _rel(out.float(), _logits(model, other)) < TOLERANCE
