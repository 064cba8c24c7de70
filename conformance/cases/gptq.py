"""GPTQ conformance cases."""

from __future__ import annotations

import itertools

import torch

from quantcore.formats.gptq import GPTQ

from ..case import Case

__all__ = ["gptq_cases"]

FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def gptq_cases() -> list[Case]:
    """GPTQ 4-bit: every parameter combination on a small shape, in every dtype; the
    large shapes over group size × sym × act-order with bf16 and fp16."""
    cases: list[Case] = []
    grid = itertools.product((32, 128, -1), (True, False), (False, True), ("v2", "v1"))
    for gs, sym, act, ver in grid:
        fmt = GPTQ(bits=4, group_size=gs, sym=sym, desc_act=act, checkpoint_format=ver)
        for m, dtype in itertools.product((1, 7, 64), FLOATS):
            cases.append(Case(fmt, (("M", m), ("K", 128), ("N", 256)), dtype, options=(("bias", m == 7),)))
        for (k, n), m, dtype in itertools.product(((4096, 4096), (11008, 4096)), (1, 7, 64), FLOATS[:2]):
            if ver == "v1" and not (gs == 128 and not sym):
                continue  # v1 differs from v2 only in how zeros are read; one large set covers it
            profile = "ci" if dtype == torch.bfloat16 or m == 7 else "full"
            cases.append(Case(fmt, (("M", m), ("K", k), ("N", n)), dtype, profile=profile))
    # Shapes at the edge of the CPU op's rules: N not a multiple of 16, K not of 32.
    edge = GPTQ(bits=4, group_size=32, sym=False)
    cases.append(Case(edge, (("M", 3), ("K", 96), ("N", 40)), torch.bfloat16))
    cases.append(Case(GPTQ(bits=4, group_size=-1), (("M", 3), ("K", 48), ("N", 64)), torch.float16))
    return cases

