"""Transforms shared by more than one backend. A backend's own transform lives beside it."""

from .awq_gptq import AWQToGPTQ, gptq_format_for
from .gptq_rows import GPTQRows, GPTQToRows

__all__ = ["AWQToGPTQ", "GPTQRows", "GPTQToRows", "gptq_format_for"]
