"""compressed-tensors pack-quantized conformance cases: every GPTQ kernel through the
transform into GPTQ's layout, against the format's own golden dequantization."""

from __future__ import annotations

import itertools

import torch

from quantcore.formats.compressed_tensors import CompressedTensors

from ..case import Case

__all__ = ["compressed_tensors_cases"]

FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def compressed_tensors_cases() -> list[Case]:
    """4 and 8 bits × group (32, 128) and channel × sym/asym × act-order on the small
    shape in every dtype; one large 4-bit g128 weight (the CPU op's shape class); 2 bits."""
    cases: list[Case] = []
    for bits, gs, sym, act in itertools.product((4, 8), (32, 128, -1), (True, False), (False, True)):
        if act and gs == -1:
            continue  # the channel strategy has one group: nothing to reorder
        fmt = CompressedTensors(bits=bits, group_size=gs, sym=sym, act_order=act)
        for m, dtype in itertools.product((1, 7), FLOATS):
            cases.append(Case(fmt, (("M", m), ("K", 128), ("N", 256)), dtype, options=(("bias", m == 7),)))
    big = CompressedTensors(bits=4, group_size=128, sym=False)
    for m in (1, 64):
        cases.append(Case(big, (("M", m), ("K", 4096), ("N", 4096)), torch.bfloat16, profile="ci" if m == 1 else "full"))
    cases.append(Case(CompressedTensors(bits=2, group_size=64, sym=False), (("M", 3), ("K", 128), ("N", 64)),
                      torch.bfloat16))
    return cases
