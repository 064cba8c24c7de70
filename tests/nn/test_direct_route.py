"""A module's eager call after its first: straight to the kernel (``QuantModule._direct``),
with the same bits as the checked first call and as the kernel's own call, every bad input
still refused by the kernel with a ``KernelInputError`` naming it, and the checked route
back after anything that changes the kernel, its state or the way a call must go (a load,
a move, offloading) and for a module that can fall back. Each module runs on the CPU's
own kernel and on its Triton kernel (the interpreter here; the same checks on a GPU)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import quantcore
from quantcore.errors import KernelInputError
from quantcore.formats.gptq import GPTQ
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.formats.turboquant import TurboQuant
from quantcore.kernel import Requirements
from quantcore.nn.linear import QuantLinear
from quantcore.nn.moe import QuantExperts
from quantcore.nn.quant_module import QuantModule
from quantcore.nn.svdquant import SVDQuantActQuant
from quantcore.nn.turboquant import TurboQuantLinear
from quantcore.nn.turboquant.model import enable_pass2_offload
from quantcore.registry import hookimpl

K, N, E, R = 128, 64, 4, 16
GPTQ_FMT = GPTQ(bits=4, group_size=64, sym=True)
#: Where the Triton variants run: the CPU under the interpreter (the quantcore pytest plugin
#: sets it for a CPU session), else the GPU — a ``--qc-device cuda`` session compiles.
TRITON_DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


def _gptq(prefer: str | None, gen: torch.Generator, device: str) -> QuantModule:
    tensors = GPTQ_FMT.quantize(torch.randn(N, K, generator=gen) * 0.05)
    return QuantLinear(GPTQ_FMT, {k: v.to(device) for k, v in tensors.items()}, prefer=prefer)


def _turbo(prefer: str | None, gen: torch.Generator, device: str) -> QuantModule:
    fmt = TurboQuant(bits=4, group_size=64)
    module = TurboQuantLinear(K, N, fmt, bias=False, dtype=torch.bfloat16, device=device)
    tensors = fmt.quantize(torch.randn(N, K, generator=gen) * 0.05, generator=gen)
    module.load_tensors({k: v.to(device) for k, v in tensors.items()}, prefer=prefer)
    return module


def _experts(prefer: str | None, gen: torch.Generator, device: str) -> QuantModule:
    fmt = TRTLLMMoE(group_size=64, sym=True, scale_dtype=torch.bfloat16)
    tensors = fmt.quantize(torch.randn(E, K, N, generator=gen) * 0.05)
    return QuantExperts(fmt, {k: v.to(device) for k, v in tensors.items()}, prefer=prefer)


def _svdquant(prefer: str | None, gen: torch.Generator, device: str) -> QuantModule:
    tensors = {"lora_down": (torch.randn(K, R, generator=gen) * 0.1).bfloat16().to(device),
               "smooth": (torch.rand(K, generator=gen) + 0.5).bfloat16().to(device)}
    return SVDQuantActQuant(SVDQuantAct(fp4=True), tensors, prefer=prefer)


#: module → (its builder, the CPU's own kernel, its Triton kernel)
MODULES: dict[str, tuple[Callable[[str | None, torch.Generator, str], QuantModule], str, str]] = {
    "QuantLinear": (_gptq, "aten_cpu", "triton_int4"),
    "TurboQuantLinear": (_turbo, "turboquant_torch", "turboquant_triton"),
    "QuantExperts": (_experts, "trtllm_moe_torch", "trtllm_moe_triton"),
    "SVDQuantActQuant": (_svdquant, "svdquant_torch", "triton_nvfp4"),
}
CASES = [pytest.param(name, triton, id=f"{name}-{MODULES[name][2 if triton else 1]}")
         for name in MODULES for triton in (False, True)]


def _module(name: str, triton: bool, seed: int = 0) -> tuple[QuantModule, tuple[torch.Tensor, ...]]:
    build, cpu_kernel, triton_kernel = MODULES[name]
    device = TRITON_DEVICE if triton else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("Triton needs a GPU or TRITON_INTERPRET=1 (set by the quantcore pytest plugin)")
    gen = torch.Generator().manual_seed(seed)
    module = build(triton_kernel if triton else None, gen, device)
    assert module.kernel is not None and module.kernel.name == (triton_kernel if triton else cpu_kernel)
    x = torch.randn(3, K, generator=gen).bfloat16().to(device)
    rest = (torch.rand(3, E, generator=gen).argsort(dim=1)[:, :2].to(torch.int32).to(device),) \
        if name == "QuantExperts" else ()
    return module, (x, *rest)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b, strict=True))


@pytest.mark.parametrize(("name", "triton"), CASES)
def test_after_the_first_call_the_module_calls_its_kernel_directly_with_the_same_bits(name: str, triton: bool) -> None:
    module, inputs = _module(name, triton)
    assert module._direct is None
    first = module(*inputs)  # checked: its output's shape and dtype against the op's
    assert module._direct is module.kernel
    assert _same(module(*inputs), first)
    assert _same(module.kernel(*inputs, module.prepared), first)
    if module.op_kind == "linear":  # leading dims: [B, T, K] (the others take [T, K] only)
        x3 = inputs[0].view(1, 3, K)
        assert _same(module(x3), module.kernel(x3, module.prepared))


@pytest.mark.parametrize(("name", "triton"), CASES)
def test_bad_inputs_are_refused_on_the_direct_route(name: str, triton: bool) -> None:
    module, (x, *rest) = _module(name, triton)
    good = module(x, *rest)
    assert module._direct is module.kernel
    gen = torch.Generator().manual_seed(1)
    for bad in (torch.randn(3, K + 64, generator=gen).bfloat16().to(x.device), x.double(), x.to(torch.int32)):
        with pytest.raises(KernelInputError, match=r"^x: expected .*\b128\b.* got \(3, (128|192)\) "):
            module(bad, *rest)
    if name == "QuantExperts":
        (ids,) = rest
        with pytest.raises(KernelInputError, match=r"^topk_ids: expected a 2-D int32/int64"):
            module(x, ids.float())
        if ids.is_cuda:  # no host read of the ids on CUDA: such a route's row is NaN (backends/trtllm_moe/README.md)
            out = module(x, ids + E)
            assert out.view(3, -1, N).isnan().all()
        else:
            with pytest.raises(KernelInputError, match=r"^topk_ids: expected expert ids in \[0, 4\)"):
                module(x, ids + E)
    # a strided activation is read where it lies: the bits of its contiguous copy
    strided = torch.randn(2 * K, 3, generator=gen).bfloat16().to(x.device)[::2].T
    assert not strided.is_contiguous()
    assert _same(module(strided, *rest), module(strided.contiguous(), *rest))
    assert _same(module(x, *rest), good) and module._direct is module.kernel


def test_loading_another_kernels_state_sends_the_next_call_through_the_checks() -> None:
    gen = torch.Generator().manual_seed(2)
    tensors = GPTQ_FMT.quantize(torch.randn(N, K, generator=gen) * 0.05)
    x = torch.randn(3, K, generator=gen).bfloat16()
    layer = QuantLinear(GPTQ_FMT, tensors)
    other = QuantLinear(GPTQ_FMT, GPTQ_FMT.quantize(torch.randn(N, K, generator=gen) * 0.05), prefer="torch_fallback")
    layer(x)
    assert layer._direct is layer.kernel and layer.kernel.name == "aten_cpu"
    layer.load_state_dict(other.state_dict())
    assert layer.kernel.name == "torch_fallback" and layer._direct is None
    assert _same(layer(x), other(x))
    assert layer._direct is layer.kernel


def test_an_offloaded_turboquant_layer_keeps_its_offloaded_route() -> None:
    fmt = TurboQuant(group_size=64, residual=True)
    gen = torch.Generator().manual_seed(3)
    dense = nn.Linear(K, N)
    resident = TurboQuantLinear.from_linear(dense, fmt, generator=torch.Generator().manual_seed(4))
    layer = TurboQuantLinear.from_linear(dense, fmt, generator=torch.Generator().manual_seed(4))
    x = torch.randn(2, K, generator=gen)
    with torch.no_grad():
        layer(x)
        assert layer._direct is layer.kernel
        pool = enable_pass2_offload(nn.Sequential(layer))
        assert layer._direct is None
        for _ in range(2):
            assert _same(layer(x), resident(x))
        assert layer._direct is None and [e.name for e in pool.chain] == [layer._offloaded.name]


class _FailsOnSecondCall(quantcore.LinearKernel):
    """Prepares a dense weight and answers its first call, then fails: a vendor library
    that breaks while serving."""

    name: ClassVar[str] = "fails_on_second_call"
    format: ClassVar[str] = "gptq"
    priority: ClassVar[int] = 10_000
    requires: ClassVar[Requirements] = Requirements(device_types=frozenset({"cpu"}))
    calls: ClassVar[int] = 0

    def prepare(self, tensors: Any, *, dtype: torch.dtype | None = None) -> Any:
        return {"w": GPTQ_FMT.dequantize(tensors, dtype=torch.float32)}

    def __call__(self, x: torch.Tensor, prepared: Any) -> torch.Tensor:
        type(self).calls += 1
        if type(self).calls > 1:
            raise RuntimeError("device lost")
        return (x.float() @ prepared["w"].T).to(x.dtype)


def test_a_module_that_keeps_its_source_can_still_fall_back_after_its_first_call() -> None:
    class Plugin:
        @hookimpl
        def quantcore_kernels(self) -> list[Any]:
            return [_FailsOnSecondCall]

    gen = torch.Generator().manual_seed(5)
    tensors = GPTQ_FMT.quantize(torch.randn(N, K, generator=gen) * 0.05)
    x = torch.randn(2, K, generator=gen).bfloat16()
    expected = QuantLinear(GPTQ_FMT, tensors)(x)
    _FailsOnSecondCall.calls = 0
    name = quantcore.register(Plugin(), name="fails_on_second_call_plugin")
    try:
        plain = QuantLinear(GPTQ_FMT, tensors)
        assert plain.kernel.name == "fails_on_second_call"
        plain(x)
        with pytest.raises(RuntimeError, match="device lost"):
            plain(x)  # no source: the direct route lets the kernel's error through, as the checked one would
        _FailsOnSecondCall.calls = 0
        kept = QuantLinear(GPTQ_FMT, tensors, keep_source=True)
        assert kept.kernel.name == "fails_on_second_call"
        kept(x)
        assert kept._direct is None  # a failing call must still reach the fallback
        assert _same(kept(x), expected) and kept.kernel.name != "fails_on_second_call"
    finally:
        quantcore.unregister(name)
