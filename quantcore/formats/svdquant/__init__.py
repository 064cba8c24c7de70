"""SVDQuant W4A4 activations (NVFP4 or INT4) and the LoRA-down branch beside them
(docs/formats/svdquant.md)."""

from .format import SVDQuantAct
from .numerics import (
    dequantize_activation,
    e2m1_codes,
    e2m1_values,
    pack_nibbles,
    quantize_activation,
    unpack_nibbles,
)

__all__ = [
    "SVDQuantAct",
    "dequantize_activation",
    "e2m1_codes",
    "e2m1_values",
    "pack_nibbles",
    "quantize_activation",
    "unpack_nibbles",
]
