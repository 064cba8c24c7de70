"""The trtllm_moe kernels' contracts: input errors, selection and refusals with reasons,
and the tensors handed to TensorRT-LLM."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.trtllm_moe import TensorRTLLMMoE, TorchMoE, TritonMoE
from quantcore.backends.trtllm_moe.preprocess import QuantType, preprocess_weights_for_mixed_gemm
from quantcore.backends.trtllm_moe.tensorrt_llm_kernel import plugin_tensors
from quantcore.errors import KernelInputError
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.ops.moe import moe_problem
from quantcore.probe import probe
from quantcore.selection import explain, get_kernel

FMT = TRTLLMMoE(group_size=64, sym=False, scale_dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def tensors() -> dict[str, torch.Tensor]:
    return FMT.quantize(torch.randn(3, 128, 64, generator=torch.Generator().manual_seed(3)) * 0.05)


def test_torch_kernel_refuses_bad_calls(tensors: dict[str, torch.Tensor]) -> None:
    kernel = TorchMoE(FMT, "cpu")
    prepared = kernel.prepare(tensors, dtype=torch.bfloat16)
    x = torch.randn(4, 128).bfloat16()
    ids = torch.zeros(4, 2, dtype=torch.int32)
    assert kernel(x, ids, prepared).shape == (4, 2, 64)
    assert kernel(x, ids, prepared, topk_weights=torch.ones(4, 2)).shape == (4, 64)
    with pytest.raises(KernelInputError, match="prepared: expected the ExpertWeights"):
        kernel(x, ids, {"qweight": tensors["qweight"]})
    with pytest.raises(KernelInputError, match=r"expert ids in \[0, 3\)"):
        kernel(x, ids + 3, prepared)
    with pytest.raises(KernelInputError, match="x: expected"):
        kernel(x.float(), ids, prepared)
    with pytest.raises(KernelInputError, match="dtype: expected float16 or bfloat16"):
        kernel.prepare(tensors, dtype=torch.float32)


def test_selection_on_cpu_explains_every_candidate() -> None:
    problem = moe_problem(FMT, T=4, E=3, topk=2, K=128, N=64, dtype=torch.bfloat16)
    assert get_kernel(FMT, "cpu", problem=problem).name in {"trtllm_moe_torch", "trtllm_moe_triton"}
    rows = {c.kernel: c for c in explain(FMT, "cpu", problem=problem).candidates}
    assert set(rows) >= {"trtllm_moe_torch", "trtllm_moe_triton", "tensorrt_llm"}
    assert rows["tensorrt_llm"].status == "refused" and "cuda" in rows["tensorrt_llm"].reason


def test_support_limits_name_the_dimension() -> None:
    ok = moe_problem(FMT, T=1, E=8, topk=2, K=4096, N=28672, dtype=torch.bfloat16)
    assert TritonMoE.supports(ok) and TensorRTLLMMoE.supports(ok)
    bad_k = moe_problem(FMT, T=1, E=8, topk=2, K=96, N=256, dtype=torch.bfloat16)
    assert "K=96" in TritonMoE.supports(bad_k).reason
    fp16 = moe_problem(FMT, T=1, E=8, topk=2, K=128, N=256, dtype=torch.float16)
    assert "activation dtype" in TensorRTLLMMoE.supports(fp16).reason
    fp32 = moe_problem(FMT, T=1, E=8, topk=2, K=128, N=256, dtype=torch.float32)
    assert not TorchMoE.supports(fp32)


def test_tensorrt_llm_is_refused_with_a_reason_here() -> None:
    reason = TensorRTLLMMoE.check_device(probe("cpu"))
    assert reason and "cuda" in reason


@pytest.mark.parametrize("arch", [80, 86, 90])
def test_plugin_tensors_are_the_moe_layout_viewed_as_fp16(tensors: dict[str, torch.Tensor], arch: int) -> None:
    out = plugin_tensors(FMT, tensors, arch)
    assert out.weight.dtype == torch.float16 and tuple(out.weight.shape) == (3, 128, 32)
    expected = preprocess_weights_for_mixed_gemm(tensors["qweight"], QuantType.W8_A16, 80 if arch == 90 else arch)
    assert torch.equal(out.weight.view(torch.int8), expected)
    assert out.scales is tensors["scales"] and out.zeros is tensors["zeros"]
