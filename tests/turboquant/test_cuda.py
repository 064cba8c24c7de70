"""What only a GPU can show: the offload path on real streams gives the resident path's
outputs bit for bit, and the fused kernels agree with the torch backend there."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from quantcore.formats.turboquant import TurboQuant
from quantcore.nn.turboquant.model import enable_pass2_offload
from quantcore.nn.turboquant.module import TurboQuantLinear

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _stack(k: int, layers: int) -> nn.Sequential:
    gen = torch.Generator().manual_seed(1)
    fmt = TurboQuant(residual=True)
    mods = []
    for _ in range(layers):
        lin = nn.Linear(k, k)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(k, k, generator=gen) * 0.02)
            lin.bias.copy_(torch.randn(k, generator=gen) * 0.1)
        mods.append(TurboQuantLinear.from_linear(lin.cuda(), fmt, generator=gen))
    return nn.Sequential(*mods)


@cuda
@pytest.mark.parametrize("m", [1, 64])
def test_cuda_offload_matches_resident_bit_for_bit(m: int) -> None:
    resident = _stack(512, 5)
    offloaded = copy.deepcopy(resident)
    pool = enable_pass2_offload(offloaded)
    assert all(offloaded[i].passes_1_indices.device.type == "cpu" for i in range(5))
    assert all(offloaded[i].passes_0_indices.device.type == "cuda" for i in range(5))
    gen = torch.Generator(device="cuda").manual_seed(2)
    with torch.no_grad():
        for step in range(4):
            x = torch.randn(m, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
            before = pool.copies
            assert torch.equal(offloaded(x), resident(x)), f"step {step}"
            if step >= 2:  # steady state: one prefetch per layer, nothing loaded on demand
                assert pool.copies - before == 5
    torch.cuda.synchronize()
    # What streams in is one pinned host buffer a layer (an unpinned one would copy synchronously).
    assert all(offloaded[i]._offloaded.flat.is_pinned() for i in range(5))


@cuda
def test_cuda_offload_survives_a_module_move() -> None:
    offloaded = _stack(256, 3)
    enable_pass2_offload(offloaded)
    offloaded.to("cuda")
    assert offloaded[1].passes_1_scales.device.type == "cpu"
    assert offloaded[1].passes_0_indices.device.type == "cuda"
    x = torch.randn(3, 256, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        assert offloaded(x).dtype == torch.float16


@cuda
@pytest.mark.parametrize("prepare_dtype", [None, torch.bfloat16], ids=["float32-rotation", "bf16-rotation"])
@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("group_size", [256, 512])
def test_cuda_wide_groups_rotate_outside(group_size: int, m: int, prepare_dtype: torch.dtype | None) -> None:
    """A layer prepared without a dtype keeps its float32 rotation: at d = 256 the decode
    kernel's in-program rotation needed 278,528 B of shared memory and raised
    OutOfResources at the first call (the kernel fuzz, on an H200). Where Π would not fit
    beside a program's tiles, x is now rotated by a GEMM before the launch (the decode
    kernel at M = 1, the tensor-core kernel's eager call at M = 16), and the answer is the
    golden's."""
    from quantcore.backends.turboquant_triton import TurboQuantTriton
    from quantcore.conformance.tolerance import compare, tolerance_for
    from quantcore.ops.linear import linear_reference

    fmt = TurboQuant(group_size=group_size)
    gen = torch.Generator().manual_seed(group_size)
    t = fmt.quantize(torch.randn(96, 2 * group_size, generator=gen) * 0.05, generator=gen)
    kernel = TurboQuantTriton(fmt, "cuda")
    prepared = kernel.prepare({k: v.cuda() for k, v in t.items()}, dtype=prepare_dtype)
    x = torch.randn(m, 2 * group_size, generator=gen).to(torch.bfloat16)
    y = kernel(x.cuda(), prepared)
    result = compare(y.cpu(), linear_reference(x, fmt.dequantize(t), None), tolerance_for(torch.bfloat16))
    assert result.ok, result.problem
