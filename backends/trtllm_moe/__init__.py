"""``trtllm_moe``: the TensorRT-LLM MoE INT8 group-wise format's kernels.

- ``trtllm_moe_torch``   plain PyTorch, any device
- ``trtllm_moe_triton``  Triton grouped GEMM reading TensorRT-LLM's preprocessed MoE
                         layout, dequantization fused (CUDA; the interpreter on CPU)
- ``tensorrt_llm``       TensorRT-LLM's own MoE fed the preprocessed weights; probed,
                         refused with the reason where it cannot run (everywhere so
                         far: see its module)

``preprocess/`` is TensorRT-LLM's CUTLASS weight preprocessor, bit for bit, with its
inverse. Nothing heavy is imported here: triton and tensorrt_llm load inside the
kernels' prepare/call paths.
"""

from quantcore.registry import hookimpl

from .tensorrt_llm_kernel import TensorRTLLMMoE
from .torch_kernel import TorchMoE
from .triton_kernel import TritonMoE


@hookimpl
def quantcore_kernels() -> list[type]:
    return [TorchMoE, TritonMoE, TensorRTLLMMoE]


__all__ = ["TensorRTLLMMoE", "TorchMoE", "TritonMoE"]
