"""What is computed. Each op has one golden reference in float64; its harness
(:mod:`.harness`, :mod:`.harnesses`) draws a :class:`~.case.Case`'s weights and inputs and
judges a kernel's output against that reference by the tolerance policy (:mod:`.tolerance`)."""

from __future__ import annotations

from .act_quant_lora import ACT_QUANT_LORA
from .base import Op
from .linear import LINEAR
from .moe import MOE

__all__ = ["ACT_QUANT_LORA", "LINEAR", "MOE", "Op", "get_op"]

_OPS: dict[str, Op] = {LINEAR.name: LINEAR, MOE.name: MOE, ACT_QUANT_LORA.name: ACT_QUANT_LORA}


def get_op(name: str) -> Op:
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"op: expected one of {sorted(_OPS)}, got {name!r}") from None


def register_op(op: Op) -> None:
    _OPS[op.name] = op
