"""TurboQuant weights (docs/formats/turboquant.md).

The format and its golden math live here; the runtime — the kernels' pass contract, the
``TurboQuantLinear`` module, the model-level API (``TurboQuantConfig``, ``quantize_model``,
``save_quantized``, ``load_quantized``) and the pass-2 CPU offload — in
:mod:`quantcore.nn.turboquant`, above the registry and selection it uses.
"""

from __future__ import annotations

from .codebook import (
    CLASSICAL_LLOYD_MAX_16,
    codebook_tensor,
    gaussian_distortion,
    lloyd_max_gaussian,
)
from .format import PASS_TENSORS, RESIDUAL_PREFIX, TurboQuant, pack_indices, unpack_indices

__all__ = [
    "CLASSICAL_LLOYD_MAX_16",
    "PASS_TENSORS",
    "RESIDUAL_PREFIX",
    "TurboQuant",
    "codebook_tensor",
    "gaussian_distortion",
    "lloyd_max_gaussian",
    "pack_indices",
    "unpack_indices",
]
