"""Which path and tile a call runs: the shipped tuned table, else a default rule.

A plan is chosen per call from the problem alone (no autotuning at run time, so the
first call is as fast as the rest): ``plan_for(shape, device)``. The key holds
everything that changes a kernel's geometry: bits, the close-run of the groups
(``CLOSE`` slices), K, N, the activation dtype and the M bucket. The table
``TUNED`` was measured on an H100 (``sweep.py``; numbers in README.md); other devices,
and shapes missing from it, take :func:`default_plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEQUANT_BLOCK_N",
    "INTERPRETER_GEMV",
    "INTERPRETER_MMA",
    "TUNED",
    "GemvConfig",
    "MmaConfig",
    "Plan",
    "Shape",
    "default_plan",
    "m_bucket",
    "plan_for",
]


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
    #: 1: exact integer operand, scale on the accumulator; 2: scaled operand (kernels.py).
    operand: int = 1
    #: Blocks per loop iteration (unrolled): fewer loop overheads per code.
    block_b: int = 1


@dataclass(frozen=True)
class Plan:
    path: Literal["gemv", "mma", "dequant"]
    gemv: GemvConfig | None = None
    mma: MmaConfig | None = None


@dataclass(frozen=True)
class Shape:
    """What a plan depends on."""

    m: int
    k: int
    n: int
    bits: int
    close: int  # slices per scale group (kernels.py)
    dtype: str  # "bf16" / "fp16"

    def key(self) -> tuple[int, int, int, int, int, str]:
        return (self.bits, self.close, self.k, self.n, m_bucket(self.m), self.dtype)


def m_bucket(m: int) -> int:
    """Power-of-two bucket of M (capped): plans are keyed by it."""
    return min(1 << max(m - 1, 0).bit_length(), 4096)


#: Fixed tiles under the interpreter: few, large programs (it pays per operation).
INTERPRETER_GEMV = GemvConfig(block_n=64, block_b=2, num_warps=4, num_stages=1)
INTERPRETER_MMA = MmaConfig(block_n=64, block_m=64, num_warps=4, num_stages=1, operand=0)
DEQUANT_BLOCK_N = 64

#: device name → {Shape.key(): Plan}; written from sweep.py results on the device.
TUNED: dict[str, dict[tuple[int, int, int, int, int, str], Plan]] = {}


def _pow2_at_least(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, 1 << max(v - 1, 0).bit_length()))


def default_plan(shape: Shape, sms: int) -> Plan:
    """A rule for shapes the table lacks: tensor cores at every M (the dequantization
    costs fewer instructions per code there than on the CUDA cores, README.md), 128
    outputs per program, K split until the tiles fill the GPU twice over."""
    blocks = -(-shape.k // (512 // shape.bits))
    block_m = _pow2_at_least(shape.m, 16, 128)
    block_n = 128
    warps = 4 if block_m <= 64 else 8
    tiles = -(-shape.n // block_n) * -(-shape.m // block_m)
    split = max(1, min(blocks, 8, -(-2 * sms // tiles))) if shape.m <= 256 else 1
    return Plan("mma", mma=MmaConfig(block_n, block_m, split, warps, 3, 1))


def plan_for(shape: Shape, device_name: str, sms: int) -> Plan:
    return TUNED.get(device_name, {}).get(shape.key()) or default_plan(shape, sms)
