"""Which of the aten ops quantcore's backends use have a kernel for a dispatch key."""

from __future__ import annotations

import torch

__all__ = ["QUANT_ATEN_OPS", "ops_with_kernel"]

#: The aten ops the built-in backends call; probing reports which a device implements.
QUANT_ATEN_OPS = (
    "_convert_weight_to_int4pack_for_cpu",
    "_weight_int4pack_mm_for_cpu",
    "_convert_weight_to_int4pack",
    "_weight_int4pack_mm",
    "_weight_int4pack_mm_with_scales_and_zeros",
    "_weight_int8pack_mm",
)


def ops_with_kernel(dispatch_key: str) -> frozenset[str]:
    """Ops from :data:`QUANT_ATEN_OPS` registered for ``dispatch_key`` (``CPU``, ``CUDA``…).

    Existence in ``torch.ops.aten`` is not enough: ``_weight_int4pack_mm_with_scales_
    and_zeros`` exists in every build but runs only on XPU.
    """
    present = set()
    for op in QUANT_ATEN_OPS:
        if not hasattr(torch.ops.aten, op):
            continue
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", dispatch_key):
                present.add(op)
        except RuntimeError:
            continue
    return frozenset(present)
