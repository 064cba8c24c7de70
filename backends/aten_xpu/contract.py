"""``aten._weight_int4pack_mm_with_scales_and_zeros`` emulated in plain torch.

No XPU exists where this project's CI runs, so the transform is proven against this
emulation of the op's contract, written from its public sources:

* ``torch/_meta_registrations.py`` (``meta__weight_int4pack_mm_with_scales_and_zeros``):
  x is 2-D f32/f16/bf16, the weight is int32, the result is ``[x.size(0), w.size(0)]``
  in x's dtype;
* ``test/xpu/test_gemm.py::test__int4_mm`` in pytorch: weights quantized as
  ``q = round(w / s + z)`` with int8 zero points ``z [K/group, N]`` and scales
  ``[K/group, N]``, packed two per byte with the even input in the low nibble
  (``out[:, 1::2] << 4 | out[:, 0::2]``); ``[N, K/2]`` uint8 is byte for byte the
  ``[N, K/8]`` int32 lanes of GPTQModel's ``transform_xpu`` (little-endian);
* FlagGems' Triton reimplementation of the op computes ``w = (q − zero) · scale``
  with ``group = k // qGroupSize``; SGLang's XPU W4A16 scheme documents the same.

So ``y[m, n] = Σ_k x[m, k] · (q[n, k] − zeros[k // group_size, n]) · scales[k // group_size, n]``,
accumulated in fp32 here.
"""

from __future__ import annotations

import torch

from quantcore.errors import KernelInputError
from quantcore.formats.packing import unpack_codes
from quantcore.tensors import describe

__all__ = ["weight_int4pack_mm_with_scales_and_zeros"]


def weight_int4pack_mm_with_scales_and_zeros(
    x: torch.Tensor, qweight: torch.Tensor, group_size: int, scales: torch.Tensor, zeros: torch.Tensor
) -> torch.Tensor:
    if x.dim() != 2 or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise KernelInputError(f"x: expected 2-D f32/f16/bf16, got {describe(x)}")
    k = x.shape[1]
    if qweight.dtype != torch.int32 or qweight.dim() != 2 or qweight.shape[1] * 8 != k:
        raise KernelInputError(f"qweight: expected int32 [N, {k // 8}], got {describe(qweight)}")
    n = qweight.shape[0]
    groups = k // group_size
    if k % group_size or scales.shape != (groups, n) or zeros.shape != (groups, n):
        raise KernelInputError(
            f"scales / zeros: expected [{groups}, {n}] for group_size={group_size}, got "
            f"{describe(scales)} / {describe(zeros)}"
        )
    q = unpack_codes(qweight, 4, dim=1).to(torch.float32)  # [N, K]
    g = torch.arange(k, device=x.device) // group_size
    w = (q - zeros.to(torch.float32)[g].T) * scales.to(torch.float32)[g].T
    return (x.to(torch.float32) @ w.T).to(x.dtype)
