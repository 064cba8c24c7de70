"""TensorRT-LLM MoE INT8 kernels' shared code: the base (format check, activation dtypes,
the prepared-state check; :mod:`.base`) and what one MoE call moves (:mod:`.cost`)."""

from .base import ACT_DTYPES, TRTLLMMoEKernel

__all__ = ["ACT_DTYPES", "TRTLLMMoEKernel"]
