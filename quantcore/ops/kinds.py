"""Finding the op kinds: every sub-package of :mod:`quantcore.ops` declares one as ``OP``,
so a new op kind is a new folder and nothing else."""

from __future__ import annotations

import importlib
import pkgutil
import threading
from pathlib import Path

from .op import Op

__all__ = ["get_op", "op_kinds"]

_FOLDER = Path(__file__).resolve().parent
_found: dict[str, Op] | None = None
_lock = threading.Lock()


def op_kinds() -> dict[str, Op]:
    """Every declared op kind, by name."""
    global _found
    if _found is None:
        with _lock:
            if _found is None:
                _found = _discover()
    return _found


def get_op(name: str) -> Op:
    """The op kind ``name`` (``"linear"``, ``"moe"``, ``"act_quant_lora"``)."""
    try:
        return op_kinds()[name]
    except KeyError:
        raise KeyError(f"op: expected one of {sorted(op_kinds())}, got {name!r}") from None


def _discover() -> dict[str, Op]:
    found: dict[str, Op] = {}
    for info in sorted(pkgutil.iter_modules([str(_FOLDER)]), key=lambda i: i.name):
        if not info.ispkg:
            continue
        op = getattr(importlib.import_module(f"{__package__}.{info.name}"), "OP", None)
        if not isinstance(op, Op) or op.name != info.name:
            raise TypeError(f"quantcore/ops/{info.name}: expected OP = Op(name={info.name!r}, ...), got {op!r:.80}")
        found[op.name] = op
    return found
