"""A GPTQ or AWQ layer quantized from fresh random weights (with a bias) and prepared for
``hopper_wgmma`` on a device: what the tests of its small-M and decode paths share."""

from __future__ import annotations

from typing import Any

import torch

from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaAWQ, HopperWgmmaGPTQ
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ


def prepared_layer(fmt: GPTQ | AWQ, k: int, n: int, seed: int,
                   device: str) -> tuple[Any, dict[str, torch.Tensor], torch.Tensor]:
    """(the prepared state on ``device``, the layer's tensors on the CPU, its float64 weight)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    tensors = fmt.quantize(w, generator=gen) if isinstance(fmt, GPTQ) else fmt.quantize(w)
    tensors["bias"] = torch.randn(n, generator=gen).half()
    cls = HopperWgmmaGPTQ if isinstance(fmt, GPTQ) else HopperWgmmaAWQ
    prepared = cls(fmt, device).prepare({a: t.to(device) for a, t in tensors.items()})
    return prepared, tensors, fmt.dequantize(tensors, torch.float64)
