"""Tiles measured on a GPU, shipped so a first call does not tune.

``SHIPPED[card][key]`` is a :class:`.tile.Tile`. The card is a
:class:`~quantcore.probe.card.CardKey` (architecture, SMs, shared memory per block,
bandwidth class), so a card without a table of its own takes the nearest table of its
architecture (an H200 the H100's) and a card of another architecture the rule
(:mod:`quantcore.probe.card_tables`). The key holds
everything that changes the compiled kernel or its geometry: format, N, R, the M
bucket (M_pad rounded up to a power of two, so a batch of 4352 rows and one of 4096
share a tile but 256 rows have their own), activation dtype, smooth on/off. A shape
without an entry falls back to :func:`.triton_kernel.pick_tile`. The entries come from
the tile probe (``python -m tools.probes.act_quant_lora_tiles``) on that GPU; README.md
here has the times.
"""

from __future__ import annotations

import torch

from ...dtypes import dtype_name
from ...formats.svdquant import SVDQuantAct
from ...probe.card import CardKey
from ...probe.card_tables import H100_SXM, table_for
from .tile import Tile

__all__ = ["SHIPPED", "config_key", "shipped_tile"]


def config_key(fmt: SVDQuantAct, m_pad: int, n: int, r: int, dtype: torch.dtype, smooth: bool) -> str:
    bucket = 1 << max(0, (m_pad - 1).bit_length())
    return f"{'nvfp4' if fmt.fp4 else 'int4'}-N{n}-R{r}-M{bucket}-{dtype_name(dtype)}-{'smooth' if smooth else 'plain'}"


#: From the sweep on an H100 SXM (132 SMs), 2026-11-24 (README.md here: every candidate
#: bit-exact against svdquant_torch); the time is that sweep's CUDA-graph median.
#: Fields: bm, bn, warps, stages, grid (0: per SM), tree, register cap, programs per SM.
SHIPPED: dict[CardKey, dict[str, Tile]] = {
    H100_SXM: {
        "nvfp4-N3840-R32-M8192-bf16-smooth": Tile(64, 64, 4, 3, 0, 1, 168, 3),  # 30.5 µs
        "nvfp4-N3840-R128-M8192-bf16-smooth": Tile(64, 64, 4, 3, 0, 1, None, 2),  # 44.7 µs
        "nvfp4-N10240-R32-M8192-bf16-smooth": Tile(64, 64, 4, 3, 0, 1, 168, 3),  # 66.7 µs
        "nvfp4-N10240-R128-M8192-bf16-smooth": Tile(64, 64, 4, 3, 0, 1, 168, 3),  # 87.4 µs
        "nvfp4-N3840-R32-M256-bf16-smooth": Tile(32, 128, 4, 3, 0, 1, None, 1),  # 8.5 µs
        "nvfp4-N3840-R128-M256-bf16-smooth": Tile(16, 128, 4, 3, 0, 1, 128, 1),  # 11.6 µs
        "nvfp4-N10240-R32-M256-bf16-smooth": Tile(32, 64, 4, 3, 0, 1, 128, 2),  # 13.0 µs
        "nvfp4-N10240-R128-M256-bf16-smooth": Tile(16, 64, 4, 3, 0, 1, 128, 2),  # 20.9 µs
        "int4-N3840-R32-M8192-bf16-smooth": Tile(128, 64, 8, 3, 0, 1, 128, 2),  # 26.2 µs
        "int4-N3840-R128-M8192-bf16-smooth": Tile(64, 64, 4, 3, 0, 1, None, 2),  # 38.6 µs
        "int4-N10240-R32-M8192-bf16-smooth": Tile(128, 64, 8, 3, 0, 1, 128, 2),  # 56.6 µs
        "int4-N10240-R128-M8192-bf16-smooth": Tile(64, 64, 4, 3, 0, 1, 168, 3),  # 78.3 µs
        "int4-N3840-R32-M256-bf16-smooth": Tile(32, 128, 4, 3, 0, 1, 128, 1),  # 8.1 µs
        "int4-N3840-R128-M256-bf16-smooth": Tile(16, 128, 4, 3, 0, 1, 128, 1),  # 11.1 µs
        "int4-N10240-R32-M256-bf16-smooth": Tile(64, 128, 4, 3, 0, 1, None, 1),  # 12.4 µs
        "int4-N10240-R128-M256-bf16-smooth": Tile(16, 64, 4, 3, 0, 1, 128, 2),  # 18.1 µs
    },
}


def shipped_tile(card: CardKey | None, fmt: SVDQuantAct, m_pad: int, n: int, r: int, dtype: torch.dtype,
                 smooth: bool) -> Tile | None:
    table = table_for(SHIPPED, card) or {}
    return table.get(config_key(fmt, m_pad, n, r, dtype, smooth))
