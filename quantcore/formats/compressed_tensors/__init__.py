"""compressed-tensors ``pack-quantized``: integer weights as llm-compressor writes them."""

from .format import CompressedTensors

__all__ = ["CompressedTensors"]
