"""Kernel calls as ``torch.library`` custom ops (``quantcore::linear``, ``quantcore::moe``,
``quantcore::act_quant_lora``), so ``torch.compile``, CUDA graphs and ``torch.export``
see every kernel as one op with a fake implementation.

``state.py``  a prepared state as tensors + a static tree (flatten / unflatten)
``ops.py``    the three ops, their output rules, :class:`KernelOp` for engines' own modules

Importing this module defines the ops (it imports torch); ``import quantcore`` does not.
"""

from __future__ import annotations

from .ops import KernelOp, call_op, make_spec, resolve, traced
from .state import FlattenedState, flatten, unflatten

__all__ = ["FlattenedState", "KernelOp", "call_op", "flatten", "make_spec", "resolve", "traced", "unflatten"]
