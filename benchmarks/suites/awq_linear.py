"""AWQ 4-bit linear (GEMM layout): every kernel that can run here — ``awq_cpu`` on CPU,
``aten_cuda`` on NVIDIA GPUs, the dense fallback — against dense bf16 and fp32
``F.linear`` on the same shapes as ``gptq_linear``.

The kernels run the prepared (repacked) weights, so their timings compare directly
with ``gptq_linear``'s; the difference between the two formats is all in ``prepare``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import torch

from quantcore.formats.awq import AWQ
from quantcore.problem import Problem

from ..memory import with_fresh_codes
from ..spec import BenchCase
from ._linear import linear_case
from .gptq_linear import GOALS, SHAPES, dtype_of, goal_notes, skip_slow

__all__ = ["DESCRIPTION", "SHAPES", "cases", "problems"]

DESCRIPTION = "AWQ int4 g128 linear (zero points): registered kernels vs dense bf16/fp32"
FMT = AWQ(bits=4, group_size=128, zero_point=True)
DTYPE = torch.bfloat16


@functools.lru_cache(maxsize=1)
def _quantized(k: int, n: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return FMT.quantize(torch.randn(n, k, generator=gen) * 0.02)


def _weights(k: int, n: int, sets: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    return with_fresh_codes(_quantized(k, n, seed), sets, torch.Generator().manual_seed(seed + 1))


def _awq_bytes(m: int, k: int, n: int) -> int:
    groups = k // FMT.group_size
    return k * n // 2 + groups * n * 2 + groups * n // 2 + 2 * m * k + 2 * m * n


def problems(shapes: list[dict[str, int]]) -> list[Problem]:
    """The problems the suite's cases time (``quantcore tune --suite``)."""
    return [Problem.linear(FMT, M=s["M"], K=s["K"], N=s["N"], dtype=dtype_of(s)) for s in shapes]


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    for dims in shapes:
        yield linear_case("awq_linear", FMT, dtype_of(dims), dims, device, _weights,
                          _awq_bytes(dims["M"], dims["K"], dims["N"]), skip=skip_slow)


def summarize(rows: list[dict]) -> list[str]:
    notes = goal_notes(rows, None, GOALS, 0.8)
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = {r["variant"]: r for r in rows if r["case"] == case and r["role"] != "skipped"}
        for kernel in ("awq_cpu", "aten_cuda"):
            if kernel in mine:
                notes.append(f"{case}: {kernel} {mine[kernel]['speedup_vs'].get('dense_bf16', 0):.2f}× dense bf16 "
                             f"(target at M=1: ≥ 1.5×)")
    return notes
