"""GPTQ storage format (docs/formats/gptq.md)."""

from .convert import convert_checkpoint_format
from .format import GPTQ
from .quantize import act_order_g_idx

__all__ = ["GPTQ", "act_order_g_idx", "convert_checkpoint_format"]
