"""What a call runs: the path (GEMV, tensor-core MMA, dequantize + cuBLAS) and its tile.

Plain values, shared by the default rule (configs.py) and the shipped table
(tuned_h100.py), which import them from here so neither imports the other's module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["GemvConfig", "MmaConfig", "Plan"]


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_b: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class MmaConfig:
    block_n: int
    block_m: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    #: 1: exact integer operand, scale on the accumulator; 2: scaled operand (quantcore/kernels/gptq_pairs/triton_kernels.py).
    operand: int = 1
    #: Blocks per loop iteration (unrolled): fewer loop overheads per code.
    block_b: int = 1


@dataclass(frozen=True)
class Plan:
    path: Literal["gemv", "mma", "dequant"]
    gemv: GemvConfig | None = None
    mma: MmaConfig | None = None
