"""A TurboQuant layer quantized on the CPU from fresh random weights and prepared on CUDA
for ``turboquant_triton``: what the CUDA path tests share."""

from __future__ import annotations

from typing import Any

import torch

from quantcore.formats.turboquant import TurboQuant

#: One pass at d = 128, two passes, and two passes of d = 64 with a rotation per group.
FORMATS = (TurboQuant(group_size=128), TurboQuant(group_size=128, residual=True),
           TurboQuant(group_size=64, residual=True, rotation_per_group=True))
#: The activation dtypes the CUDA paths take.
DTYPES = (torch.bfloat16, torch.float16)


def quantized_layer(fmt: TurboQuant, n: int, k: int, seed: int) -> dict[str, torch.Tensor]:
    """The layer's tensors on the CPU, from fresh random weights, with a bias."""
    gen = torch.Generator().manual_seed(seed)
    t = fmt.quantize(torch.randn(n, k, generator=gen) * 0.05, generator=gen)
    t["bias"] = torch.randn(n, generator=gen)
    return t


def prepared_on_cuda(fmt: TurboQuant, t: dict[str, torch.Tensor], dtype: torch.dtype) -> Any:
    """``t`` prepared on CUDA for ``turboquant_triton`` and activations of ``dtype``."""
    from quantcore.backends.turboquant_triton import TurboQuantTriton

    return TurboQuantTriton(fmt, "cuda").prepare({name: v.cuda() for name, v in t.items()}, dtype=dtype)


def cuda_layer(fmt: TurboQuant, n: int, k: int, dtype: torch.dtype, seed: int) -> tuple[dict[str, torch.Tensor], Any]:
    """The layer's tensors (CPU, with a bias) and its state prepared on CUDA for ``dtype``."""
    t = quantized_layer(fmt, n, k, seed)
    return t, prepared_on_cuda(fmt, t, dtype)
