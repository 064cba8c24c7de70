"""GPTQ storage format (seeds/gptq-storage-format.md)."""

from .convert import convert_checkpoint_format
from .format import GPTQ
from .quantize import act_order_g_idx

__all__ = ["GPTQ", "act_order_g_idx", "convert_checkpoint_format"]
