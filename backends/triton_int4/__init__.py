"""``triton_int4``: GPTQ (4/8-bit) and AWQ (4-bit) linears in Triton — a CUDA-core GEMV
for one row, a tensor-core GEMM that dequantizes in registers above, and a
dequantize-into-a-scratch + cuBLAS path for large batches (CUDA; the interpreter on CPU).

Importing this plugin does not import triton: the kernels load on the first call.
"""

from quantcore.kernels.compressed_tensors import via_gptq
from quantcore.registry import hookimpl

from .kernel import TritonInt4AWQ, TritonInt4GPTQ


@hookimpl
def quantcore_kernels() -> list[type]:
    return [TritonInt4GPTQ, TritonInt4AWQ, via_gptq(TritonInt4GPTQ)]


__all__ = ["TritonInt4AWQ", "TritonInt4GPTQ"]
