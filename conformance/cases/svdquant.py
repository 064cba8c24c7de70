"""svdquant conformance cases: op ``act_quant_lora`` (the SVDQuant W4A4 pre-GEMM).

full: the issue's grid — M ∈ {1, 255, 256, 4352}, N ∈ {64, 3840, 10240}, R ∈ {0, 32,
128, 256}, smooth on / off, fp16 / bf16, NVFP4 and INT4 (384 cases; the device lanes).
ci: the part of it the CPU interpreter runs in well under a minute — every M, N = 64
and 3840, every R, both smooth settings, both dtypes and formats, in a thinned product —
plus N = 128 (the smallest N where INT4 rows carry a block of exact ties besides).
"""

from __future__ import annotations

import itertools

import torch

from quantcore.formats.svdquant import SVDQuantAct

from ..case import Case

__all__ = ["svdquant_cases"]

FLOATS = (torch.float16, torch.bfloat16)
MS = (1, 255, 256, 4352)
NS = (64, 3840, 10240)
RS = (0, 32, 128, 256)
WEIGHT_DIMS = ("N", "R")


def _in_ci(m: int, n: int, r: int, smooth: bool, dtype: torch.dtype) -> bool:
    if n == 64:  # every M and R once per (smooth, dtype) pair, rotated so all R appear
        return r == RS[(MS.index(m) + FLOATS.index(dtype) + 2 * smooth) % len(RS)]
    if n == 3840:  # one row tile of the format's smaller target N, with and without LoRA
        return m == 256 and r == (32 if smooth else 0) and dtype == torch.bfloat16
    return False


def _case(fmt: SVDQuantAct, m: int, n: int, r: int, smooth: bool, dtype: torch.dtype, profile: str) -> Case:
    options = (("smooth", True),) if smooth else ()
    # smooth changes the layer's tensors: its own seed keeps cached weights apart
    return Case(fmt, (("M", m), ("N", n), ("R", r)), dtype, seed=int(smooth), options=options,
                profile=profile, weight_dims=WEIGHT_DIMS)


def svdquant_cases() -> list[Case]:
    cases: list[Case] = []
    for fp4 in (True, False):
        fmt = SVDQuantAct(fp4=fp4)
        for m, n, r, smooth, dtype in itertools.product(MS, NS, RS, (False, True), FLOATS):
            cases.append(_case(fmt, m, n, r, smooth, dtype, "ci" if _in_ci(m, n, r, smooth, dtype) else "full"))
        for m, r, smooth, dtype in ((1, 32, True, torch.float16), (255, 128, False, torch.bfloat16),
                                    (256, 256, True, torch.bfloat16)):
            cases.append(_case(fmt, m, 128, r, smooth, dtype, "ci"))
    return cases
