"""``svdquant_torch``: the SVDQuant pre-GEMM (``act_quant_lora``) in plain PyTorch, any
device, NVFP4 and INT4; also the unfused peer of the fused Triton kernels."""

from quantcore.registry import hookimpl

from .kernel import TorchActQuantLora


@hookimpl
def quantcore_kernels() -> list[type]:
    return [TorchActQuantLora]


__all__ = ["TorchActQuantLora"]
