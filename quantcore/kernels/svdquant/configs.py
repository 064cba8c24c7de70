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

Measured tables also ship as ``tuned-<card slug>.json`` beside this file, written by the
plan probe (``python -m tools.probes.act_quant_lora_plans --table DIR``): ``{"card": {...},
"entries": [{"key": <config_key>, "tile": {<Tile fields>}, "us": ...}, ...]}``. A file's
entries win over :data:`SHIPPED`'s for the same card and key (they were measured later,
with the plan options).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import torch

from ...dtypes import dtype_name
from ...errors import InvalidArgumentError
from ...formats.svdquant import SVDQuantAct
from ...probe.card import CardKey
from ...probe.card_tables import H100_SXM, read_card_json, table_for
from .tile import Tile

__all__ = ["SHIPPED", "config_key", "load_table", "shipped_tile", "tables"]


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


def load_table(path: Path) -> tuple[CardKey, dict[str, Tile]]:
    """One ``tuned-<card>.json``: its card and its tiles by :func:`config_key`."""
    card, data = read_card_json(path)
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise InvalidArgumentError(f"{path}: expected \"entries\": a list of tuned tiles, got {type(entries).__name__}")
    names = {f.name for f in dataclasses.fields(Tile)}
    out: dict[str, Tile] = {}
    for entry in entries:
        try:
            fields: dict[str, Any] = entry["tile"]
            unknown = set(fields) - names
            if unknown:
                raise ValueError(f"unknown tile fields {sorted(unknown)}")
            out[str(entry["key"])] = Tile(**fields)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"{path}: an entry is not a tuned tile ({type(exc).__name__}: {exc}): "
                                       f"{str(entry)[:120]}") from None
    return card, out


@functools.cache
def tables(folder: Path = Path(__file__).parent) -> dict[CardKey, dict[str, Tile]]:
    """:data:`SHIPPED` with every ``tuned-*.json`` of ``folder`` laid over it, per card.

    A file for a card :data:`SHIPPED` does not hold is laid over the nearest card's merged
    tiles: a measurement of some shapes on a new card must not cost it the tiles of the
    shapes it did not measure (lookups take one card's table whole)."""
    measured = [load_table(path) for path in sorted(folder.glob("tuned-*.json"))]
    merged = {card: dict(table) for card, table in SHIPPED.items()}
    for card, table in measured:
        if card in SHIPPED:
            merged[card].update(table)
    known = dict(merged)
    for card, table in measured:
        if card not in SHIPPED:
            merged.setdefault(card, dict(table_for(known, card) or {})).update(table)
    return merged


def shipped_tile(card: CardKey | None, fmt: SVDQuantAct, m_pad: int, n: int, r: int, dtype: torch.dtype,
                 smooth: bool) -> Tile | None:
    table = table_for(tables(), card) or {}
    return table.get(config_key(fmt, m_pad, n, r, dtype, smooth))
