"""GPTQ conformance cases."""

from __future__ import annotations

import itertools

import torch

from quantcore.formats.gptq import GPTQ

from ..case import Case

__all__ = ["gptq_cases"]

FLOATS = (torch.bfloat16, torch.float16, torch.float32)
SMALL = (("K", 128), ("N", 256))


def _small(fmt: GPTQ, runs: tuple[tuple[int, torch.dtype], ...]) -> list[Case]:
    return [Case(fmt, (("M", m), *SMALL), dtype, options=(("bias", m == 7),)) for m, dtype in runs]


def gptq_cases() -> list[Case]:
    """GPTQ 4-bit: every parameter combination on a small shape, in every dtype; the
    large shapes over group size × sym × act-order with bf16 and fp16. Every other bit
    width over the same parameter grid on the small shape; static groups; pack dtypes."""
    cases: list[Case] = []
    grid = itertools.product((32, 128, -1), (True, False), (False, True), ("v2", "v1"))
    for gs, sym, act, ver in grid:
        fmt = GPTQ(bits=4, group_size=gs, sym=sym, desc_act=act, checkpoint_format=ver)
        cases += _small(fmt, tuple(itertools.product((1, 7, 64), FLOATS)))
        for (k, n), m, dtype in itertools.product(((4096, 4096), (11008, 4096)), (1, 7, 64), FLOATS[:2]):
            if ver == "v1" and not (gs == 128 and not sym):
                continue  # v1 differs from v2 only in how zeros are read; one large set covers it
            profile = "ci" if dtype == torch.bfloat16 or m == 7 else "full"
            cases.append(Case(fmt, (("M", m), ("K", k), ("N", n)), dtype, profile=profile))
    # 2, 3 and 8 bits: no CPU op runs them, the fallback does; one run per dtype.
    grid = itertools.product((2, 3, 8), (32, 128, -1), (True, False), (False, True), ("v2", "v1"))
    for bits, gs, sym, act, ver in grid:
        fmt = GPTQ(bits=bits, group_size=gs, sym=sym, desc_act=act, checkpoint_format=ver)
        cases += _small(fmt, ((1, torch.bfloat16), (7, torch.float16), (3, torch.float32)))
    for bits in (2, 3, 4, 8):
        fmt = GPTQ(bits=bits, group_size=32, sym=False, desc_act=True, static_groups=True)
        cases += _small(fmt, ((1, torch.bfloat16), (7, torch.float32)))
    for bits, pack in itertools.product((2, 4, 8), (torch.int8, torch.int16, torch.int64)):
        fmt = GPTQ(bits=bits, group_size=64, sym=False, pack_dtype=pack)
        cases += _small(fmt, ((1, torch.bfloat16), (7, torch.float32)))
    # Shapes at the edge of the CPU op's rules: N not a multiple of 16, K not of 32.
    edge = GPTQ(bits=4, group_size=32, sym=False)
    cases.append(Case(edge, (("M", 3), ("K", 96), ("N", 40)), torch.bfloat16))
    cases.append(Case(GPTQ(bits=4, group_size=-1), (("M", 3), ("K", 48), ("N", 64)), torch.float16))
    return cases
