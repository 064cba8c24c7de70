"""AWQ conformance cases (GEMM layout, 4-bit)."""

from __future__ import annotations

import itertools

import torch

from quantcore.formats.awq import AWQ

from ..case import Case

__all__ = ["awq_cases"]

FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def awq_cases() -> list[Case]:
    """Every group size × zero-point mode on a small shape in every dtype; the large
    shapes in bf16 (what the GPU op takes) and fp16."""
    cases: list[Case] = []
    for gs, zp in itertools.product((32, 128, -1), (True, False)):
        fmt = AWQ(group_size=gs, zero_point=zp)
        for m, dtype in itertools.product((1, 7, 64), FLOATS):
            cases.append(Case(fmt, (("M", m), ("K", 128), ("N", 256)), dtype, options=(("bias", m == 7),)))
        for (k, n), m, dtype in itertools.product(((4096, 4096), (11008, 4096)), (1, 7, 64), FLOATS[:2]):
            # CI keeps one large weight (4096², zero points, g128); the rest is the device lanes'.
            ci = gs == 128 and zp and k == 4096 and (dtype == torch.bfloat16 or m == 7)
            cases.append(Case(fmt, (("M", m), ("K", k), ("N", n)), dtype, profile="ci" if ci else "full"))
    # N not a multiple of 16 (the CPU op's packing rule), K not of 32.
    cases.append(Case(AWQ(group_size=32), (("M", 3), ("K", 96), ("N", 40)), torch.bfloat16))
    return cases
