"""TensorRT-LLM MoE INT8 group-wise format (docs/formats/trtllm_moe.md)."""

from .format import TRTLLMMoE

__all__ = ["TRTLLMMoE"]
