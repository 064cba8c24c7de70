"""Transforms shared by more than one backend. A backend's own transform lives beside it."""

from .awq_gptq import AWQToGPTQ, gptq_format_for
from .compressed_gptq import CompressedToGPTQ, gptq_format_for_compressed
from .gptq_rows import GPTQRows, GPTQToRows

__all__ = [
    "AWQToGPTQ",
    "CompressedToGPTQ",
    "GPTQRows",
    "GPTQToRows",
    "gptq_format_for",
    "gptq_format_for_compressed",
]
