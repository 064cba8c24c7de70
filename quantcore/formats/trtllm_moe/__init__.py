"""TensorRT-LLM MoE INT8 group-wise format (seeds/trtllm-moe-int8-groupwise.md)."""

from .format import TRTLLMMoE

__all__ = ["TRTLLMMoE"]
