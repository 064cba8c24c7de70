"""TurboQuant conformance cases.

The issue's grid — M ∈ {1, 16, 128} × K×N ∈ {256×512, 4096×4096, 4096×14336} × residual
on/off × fp16/bf16 — with the two large shapes in the ``full`` profile (a device lane:
the Triton interpreter would take minutes per cell on them), plus small ``ci`` cases
for every other parameter a kernel must honour: shared vs per-group rotations, group
sizes 32/64/256, 2- and 3-bit codebooks, bf16/fp32 norms, fp32 activations, a bias, and
M, N that are not multiples of any tile.
"""

from __future__ import annotations

import itertools

import torch

from quantcore.formats.turboquant import TurboQuant

from ..case import Case

__all__ = ["turboquant_cases"]

HALVES = (torch.bfloat16, torch.float16)
SHAPES = ((256, 512, "ci"), (4096, 4096, "full"), (4096, 14336, "full"))


def _linear(fmt: TurboQuant, m: int, k: int, n: int, dtype: torch.dtype, **kw: object) -> Case:
    return Case(fmt, (("M", m), ("K", k), ("N", n)), dtype, **kw)  # type: ignore[arg-type]


def turboquant_cases() -> list[Case]:
    cases: list[Case] = []
    for residual in (False, True):
        fmt = TurboQuant(bits=4, group_size=128, residual=residual)
        for (k, n, profile), m, dtype in itertools.product(SHAPES, (1, 16, 128), HALVES):
            cases.append(_linear(fmt, m, k, n, dtype, profile=profile))
    small = (("M", 3), ("K", 256), ("N", 96))
    for fmt in (
        TurboQuant(rotation_per_group=True),
        TurboQuant(rotation_per_group=True, residual=True),
        TurboQuant(group_size=64, residual=True),
        TurboQuant(group_size=32),
        TurboQuant(group_size=256, rotation_per_group=True),
        TurboQuant(bits=3, group_size=64),
        TurboQuant(bits=2, residual=True),
        TurboQuant(norm_dtype=torch.bfloat16),
        TurboQuant(norm_dtype=torch.float32, residual=True),
    ):
        for m, dtype in ((1, torch.bfloat16), (5, torch.float16)):
            cases.append(Case(fmt, (("M", m), *small[1:]), dtype))
    base = TurboQuant(residual=True)
    for m in (1, 7):
        cases.append(_linear(base, m, 256, 512, torch.float32))
        cases.append(_linear(base, m, 384, 40, torch.bfloat16, options=(("bias", True),)))
    cases.append(Case(base, small, torch.float16, options=(("bias", True),)))
    return cases
