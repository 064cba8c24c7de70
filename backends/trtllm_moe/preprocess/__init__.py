"""TensorRT-LLM's CUTLASS mixed-GEMM weight preprocessor, one module per step."""

from .layout import LayoutDetails, effective_arch, layout_details
from .preprocessor import (
    CutlassMixedGemmLayout,
    as_plugin_tensor,
    preprocess_weights_for_mixed_gemm,
    unpreprocess_weights_for_mixed_gemm,
)
from .quant_type import QuantType

__all__ = [
    "CutlassMixedGemmLayout",
    "LayoutDetails",
    "QuantType",
    "as_plugin_tensor",
    "effective_arch",
    "layout_details",
    "preprocess_weights_for_mixed_gemm",
    "unpreprocess_weights_for_mixed_gemm",
]
