"""Kernel calls as ``torch.library`` custom ops (``quantcore::linear``, ``quantcore::moe``,
``quantcore::act_quant_lora``: one per op kind of :mod:`quantcore.ops`), so
``torch.compile``, CUDA graphs and ``torch.export`` see every kernel as one op with a fake
implementation.

``state.py``  a prepared state as tensors + a static tree (flatten / unflatten)
``spec.py``   the string naming the kernel, its format, dims and state tree; read back
``schema.py`` a state handed back, checked against what the kernel's prepare makes
``ops.py``    the ops, defined from the op kinds' declarations; :class:`KernelOp` for
              engines' own modules

Importing this module defines the ops (it imports torch); ``import quantcore`` does not.
"""

from __future__ import annotations

from .ops import KernelOp, call_op, traced
from .spec import Resolved, make_spec, resolve
from .state import FlattenedState, flatten, unflatten

__all__ = ["FlattenedState", "KernelOp", "Resolved", "call_op", "flatten", "make_spec", "resolve", "traced",
           "unflatten"]
