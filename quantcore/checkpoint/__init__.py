"""Quantized checkpoints on disk: a folder of ``*.safetensors`` plus a Hugging Face
``config.json`` (``quantization_config``: GPTQ, AWQ or compressed-tensors), a GPTQ
``quantize_config.json`` or an AutoAWQ ``quant_config.json`` (docs/checkpoints.md).
:func:`load_checkpoint` reads one into a format and the tensors of every quantized
linear; :class:`QuantLinear` runs one of them through the kernel ``get_kernel`` picks
for its device; :func:`save_checkpoint` writes the GPTQ and AWQ layouts."""

from .config import format_from_config, read_quant_config, scheme_from_config
from .loader import Checkpoint, load_checkpoint
from .module import QuantLinear, quantize_linears, replace_linears
from .writer import save_checkpoint

__all__ = [
    "Checkpoint",
    "QuantLinear",
    "format_from_config",
    "load_checkpoint",
    "quantize_linears",
    "read_quant_config",
    "replace_linears",
    "save_checkpoint",
    "scheme_from_config",
]
