"""Tiles measured on a GPU, shipped so a first call does not tune.

``SHIPPED[device name][key]`` is a :class:`.triton_kernel.Tile`; the key holds
everything that changes the compiled kernel or its geometry: format, N, R, the M
bucket (M_pad rounded up to a power of two, so a batch of 4352 rows and one of 4096
share a tile but 256 rows have their own), activation dtype, smooth on/off. A shape
without an entry falls back to :func:`.triton_kernel.pick_tile`. The entries come from
``python -m quantcore.benchmarks.suites.svdquant_prequant`` (the sweep) on that GPU;
README.md here has the times.
"""

from __future__ import annotations

import torch

from quantcore.dtypes import dtype_name
from quantcore.formats.svdquant import SVDQuantAct

from .triton_kernel import Tile

__all__ = ["SHIPPED", "config_key", "shipped_tile"]


def config_key(fmt: SVDQuantAct, m_pad: int, n: int, r: int, dtype: torch.dtype, smooth: bool) -> str:
    bucket = 1 << max(0, (m_pad - 1).bit_length())
    return f"{'nvfp4' if fmt.fp4 else 'int4'}-N{n}-R{r}-M{bucket}-{dtype_name(dtype)}-{'smooth' if smooth else 'plain'}"


SHIPPED: dict[str, dict[str, Tile]] = {}


def shipped_tile(device_name: str, fmt: SVDQuantAct, m_pad: int, n: int, r: int, dtype: torch.dtype,
                 smooth: bool) -> Tile | None:
    return SHIPPED.get(device_name, {}).get(config_key(fmt, m_pad, n, r, dtype, smooth))
