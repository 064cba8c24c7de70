"""What is computed. Each op has one golden reference in float64."""

from __future__ import annotations

from .base import Op
from .linear import LINEAR
from .moe import MOE

__all__ = ["LINEAR", "MOE", "Op", "get_op"]

_OPS: dict[str, Op] = {LINEAR.name: LINEAR, MOE.name: MOE}


def get_op(name: str) -> Op:
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"op: expected one of {sorted(_OPS)}, got {name!r}") from None


def register_op(op: Op) -> None:
    _OPS[op.name] = op
