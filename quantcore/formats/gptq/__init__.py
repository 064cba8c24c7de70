"""GPTQ storage format (seeds/gptq-storage-format.md)."""

from .format import GPTQ
from .quantize import act_order_g_idx

__all__ = ["GPTQ", "act_order_g_idx"]
