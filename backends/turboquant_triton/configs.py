"""Launch configurations of the TurboQuant Triton kernels: the shipped tables (tuned on
the named devices by ``tools/probes/turboquant_tune.py``, so a first call needs no
autotuning) and the rule used where no table entry fits.

A configuration is looked up by a key holding everything that changes the kernel's
geometry — kernel, device, K, N, group size, number of passes, activation dtype, and for
the tensor-core kernel the M bucket — so a config tuned for one layer is never applied
to a layer whose groups or passes differ (a past bug: a group-64 tile reused for group
32 ran no step and returned zeros).

Tables: every ``tuned-*.json`` beside this file, then the file named by the environment
variable ``QUANTCORE_TURBOQUANT_CONFIGS`` (entries there win). Each holds a list of
entries ``{"device", "kernel": "gemv" | "mma" | "paths", "K", "N", "d", "passes",
"dtype", ["m_bucket"], "config": {...}}``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from quantcore.errors import InvalidArgumentError
from quantcore.files import read_json

__all__ = ["GemvConfig", "MmaConfig", "PathChoice", "gemv_config", "m_bucket", "mma_config", "path_for",
           "table"]

ENV = "QUANTCORE_TURBOQUANT_CONFIGS"


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

    block_n: int = 64
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


_KINDS = {"gemv": GemvConfig, "mma": MmaConfig, "paths": PathChoice}


def _dtype_name(dtype: object) -> str:
    return str(dtype).replace("torch.", "")


def _key(entry: dict[str, Any]) -> tuple[Any, ...]:
    kind = entry["kernel"]
    if kind == "paths":
        return (entry["device"], "paths")
    key = (entry["device"], kind, entry["K"], entry["N"], entry["d"], entry["passes"], entry["dtype"])
    return (*key, entry["m_bucket"]) if kind == "mma" else key


def _load(path: Path) -> dict[tuple[Any, ...], Any]:
    out: dict[tuple[Any, ...], Any] = {}
    for entry in read_json(path, error=InvalidArgumentError):
        try:
            cls = _KINDS[entry["kernel"]]
            names = {f.name for f in fields(cls)}
            out[_key(entry)] = cls(**{k: v for k, v in entry["config"].items() if k in names})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidArgumentError(f"{ENV}={path}: an entry is not a tuned config ({type(exc).__name__}: "
                                       f"{exc}): {str(entry)[:80]}") from None
    return out


@lru_cache(maxsize=4)
def _tables(extra: str | None) -> dict[tuple[Any, ...], Any]:
    merged: dict[tuple[Any, ...], Any] = {}
    for path in sorted(Path(__file__).parent.glob("tuned-*.json")):
        merged.update(_load(path))
    if extra:
        merged.update(_load(Path(extra)))
    return merged


def table() -> dict[tuple[Any, ...], Any]:
    """The shipped entries plus the environment's file."""
    return _tables(os.environ.get(ENV) or None)


def gemv_config(device: str, k: int, n: int, d: int, passes: int, dtype: object) -> GemvConfig:
    hit = table().get((device, "gemv", k, n, d, passes, _dtype_name(dtype)))
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
    hit = table().get((device, "mma", k, n, d, passes, _dtype_name(dtype), m_bucket(m)))
    if isinstance(hit, MmaConfig):
        return hit
    if m <= 16:
        return MmaConfig(block_n=64, block_m=16)
    if m <= 32:  # 3 stages would need exactly 48 KB: unlaunchable beside the 1 KB table (lookup.py)
        return MmaConfig(block_n=64, block_m=32, stages=4)
    return MmaConfig(block_n=64, block_m=64)  # beat 128-row tiles at M = 128 on the H100


def path_for(device: str) -> PathChoice:
    hit = table().get((device, "paths"))
    return hit if isinstance(hit, PathChoice) else PathChoice()
