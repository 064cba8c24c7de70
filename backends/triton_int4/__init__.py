"""``triton_int4``: GPTQ (4/8-bit) and AWQ (4-bit) linears in Triton — a CUDA-core GEMV
for one row, a tensor-core GEMM that dequantizes in registers above, and a
dequantize-into-a-scratch + cuBLAS path for large batches (CUDA; the interpreter on CPU).

Importing this plugin does not import triton: the kernels load on the first call.
"""
