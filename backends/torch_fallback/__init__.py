"""``torch_fallback``: dequantize, then matmul, on any device torch runs on.

It keeps ``get_kernel`` answering everywhere and is the plain-PyTorch peer in
benchmarks. It proves little in the matrix (it reuses the format's dequantizer), so
it is never preferred over a real kernel.
"""

from quantcore.registry import hookimpl

from .kernel import DequantLinear, fallback_for


@hookimpl
def quantcore_kernels() -> list[type]:
    return [fallback_for(name) for name in ("gptq", "awq", "turboquant", "compressed_tensors")]


__all__ = ["DequantLinear", "fallback_for"]
