"""``compressed_tensors``: compressed-tensors pack-quantized linears on every built-in GPTQ
kernel, through the lossless transform into GPTQ's layout (see kernel.py)."""

from quantcore.registry import hookimpl

from .kernel import KERNELS, ViaGPTQ, via_gptq


@hookimpl
def quantcore_kernels() -> list[type]:
    return list(KERNELS)


__all__ = ["KERNELS", "ViaGPTQ", "via_gptq"]
