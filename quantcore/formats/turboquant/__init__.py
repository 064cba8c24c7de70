"""TurboQuant weights (seeds/turboquant-inference-pipeline.md, specs/turboquant.md).

The format and its golden math live here; the model-level API (``TurboQuantConfig``,
``quantize_model``, ``save_quantized``, ``load_quantized``, ``TurboQuantLinear``) in
:mod:`quantcore.formats.turboquant.model`, imported on first use so that registering
the format stays cheap.
"""

from __future__ import annotations

from typing import Any

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
    "TurboQuantConfig",
    "TurboQuantLinear",
    "codebook_tensor",
    "gaussian_distortion",
    "lloyd_max_gaussian",
    "load_quantized",
    "pack_indices",
    "quantize_model",
    "save_quantized",
    "unpack_indices",
]

_MODEL_API = ("TurboQuantConfig", "TurboQuantLinear", "quantize_model", "save_quantized", "load_quantized")


def __getattr__(name: str) -> Any:
    if name in _MODEL_API:
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
