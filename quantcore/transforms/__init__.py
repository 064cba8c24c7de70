"""Transforms shared by more than one backend. A backend's own transform lives beside it."""

from .gptq_rows import GPTQRows, GPTQToRows

__all__ = ["GPTQRows", "GPTQToRows"]
