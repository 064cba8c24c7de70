"""GPTQ 8-bit linear: every kernel that can run here vs dense bf16/fp32 ``F.linear``
(``aten_cuda``'s tinygemm takes 4-bit codes only, so on CUDA the peers are cuBLAS and the
dense fallback). Goals: ≥ 1.8× dense bf16 at M ≤ 16, ≥ 1.0× from M = 512."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

import torch

from quantcore.formats.gptq import GPTQ

from ..spec import BenchCase
from ._linear import linear_case
from .gptq_linear import H100_KN, HOPPER_KN, goal_notes

__all__ = ["DESCRIPTION", "SHAPES", "cases", "summarize"]

DESCRIPTION = "GPTQ int8 g128 linear: registered kernels vs dense bf16/fp32"
SHAPES = {
    "default": [{"M": m, "K": 1024, "N": 1024} for m in (1, 16)],
    "h100": [{"M": m, "K": k, "N": n} for (k, n), m in itertools.product(H100_KN, (1, 4, 16, 128, 2048))],
    "hopper": [{"M": m, "K": k, "N": n} for (k, n), m in itertools.product(HOPPER_KN, (1, 16, 128, 512, 2048))],
}
FMT = GPTQ(bits=8, group_size=128, sym=True)
DTYPE = torch.bfloat16
#: 8-bit goals (every shape): ≥ 1.8× dense bf16 up to M = 16, ≥ 1.0× from M = 512.
GOALS = {"large": {1: 1.8, 16: 1.8, 512: 1.0, 2048: 1.0}, "small": {1: 1.8, 16: 1.8, 512: 1.0, 2048: 1.0}}


@functools.lru_cache(maxsize=1)
def _quantized(k: int, n: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return FMT.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen)


def weights(k: int, n: int, sets: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed + 1)
    base = _quantized(k, n, seed)
    out = [base]
    for _ in range(sets - 1):
        t = dict(base)  # same scales, fresh random codes: distinct memory, same work
        t["qweight"] = torch.randint(-(2**31), 2**31 - 1, base["qweight"].shape, generator=gen, dtype=torch.int32)
        out.append(t)
    return out


def int8_bytes(m: int, k: int, n: int) -> int:
    return k * n + (k // FMT.group_size) * n * 2 + 2 * m * k + 2 * m * n


def cases(device: str, shapes: list[dict[str, int]]) -> Iterator[BenchCase]:
    for dims in shapes:
        m, k, n = dims["M"], dims["K"], dims["N"]
        yield linear_case("gptq8_linear", FMT, DTYPE, dims, device, weights, int8_bytes(m, k, n))


def summarize(rows: list[dict[str, Any]]) -> list[str]:
    return goal_notes(rows, None, GOALS, None)
