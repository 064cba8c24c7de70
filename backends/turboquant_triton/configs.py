"""Launch configurations of the TurboQuant Triton kernels: the shipped table (tuned on the
named devices, so a first call needs no autotuning) and the rule used elsewhere.

A configuration is looked up by a key holding everything that changes the kernel's
geometry — kernel, K, N, group size, number of passes, activation dtype, and for the
tensor-core path the M bucket — so a config tuned for one layer is never applied to a
layer whose groups or passes differ (a past bug: a group-64 config reused for group 32).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GemvConfig", "MmaConfig", "PathChoice", "gemv_config", "mma_config", "path_for"]


@dataclass(frozen=True)
class GemvConfig:
    """Decode kernel: ``gpc`` groups per program, about ``ctas`` programs, ``br`` rows a
    step, the row loop unrolled ``unroll`` times (3 = the prefetch depth: no moves)."""

    gpc: int = 8
    ctas: int = 396
    br: int = 8  # rows × 128 words = 4 words (one 16-byte vector) per thread at 8 warps
    warps: int = 8
    unroll: int = 3


@dataclass(frozen=True)
class MmaConfig:
    """Tensor-core kernel: a [block_n, block_m] output tile, ``gpc`` groups per program."""

    block_n: int = 128
    block_m: int = 16
    gpc: int = 4
    warps: int = 4
    stages: int = 3
    ctas: int = 264


@dataclass(frozen=True)
class PathChoice:
    """Largest M for the decode kernel, and largest M for the fused tensor-core kernel;
    above it, dequantize into a scratch and multiply with cuBLAS."""

    gemv_max_m: int = 1
    mma_max_m: int = 256


#: Tuned on the device named by the first key element (``torch.cuda.get_device_name``).
#: Keys: (device, "gemv", K, N, d, passes, dtype) and (device, "mma", K, N, d, passes, dtype, M bucket).
SHIPPED: dict[tuple, GemvConfig | MmaConfig] = {}
PATHS: dict[str, PathChoice] = {}


def _dtype_name(dtype: object) -> str:
    return str(dtype).replace("torch.", "")


def gemv_config(device: str, k: int, n: int, d: int, passes: int, dtype: object) -> GemvConfig:
    hit = SHIPPED.get((device, "gemv", k, n, d, passes, _dtype_name(dtype)))
    if isinstance(hit, GemvConfig):
        return hit
    groups = k // d
    # 128 index words (512 bytes) of a row per program and pass: 32 lanes × one 16-byte vector.
    gpc = max(1, min(16, 1024 // d, 1 << (groups.bit_length() - 1)))
    if passes == 2:  # twice the registers: 2 programs an SM, no unrolling
        return GemvConfig(gpc=gpc, ctas=264, unroll=1)
    return GemvConfig(gpc=gpc)


def m_bucket(m: int) -> int:
    """The M part of a tensor-core key: the next power of two (16 at least), capped."""
    return min(max(16, 1 << max(m - 1, 0).bit_length()), 4096)


def mma_config(device: str, m: int, k: int, n: int, d: int, passes: int, dtype: object) -> MmaConfig:
    hit = SHIPPED.get((device, "mma", k, n, d, passes, _dtype_name(dtype), m_bucket(m)))
    if isinstance(hit, MmaConfig):
        return hit
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    return MmaConfig(block_m=bm, warps=4 if bm <= 32 else 8)  # 64-row tiles spill with 4 warps


def path_for(device: str) -> PathChoice:
    return PATHS.get(device, PathChoice())
