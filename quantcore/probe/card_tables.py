"""Tuned tables keyed by :class:`~quantcore.probe.card.CardKey`: the one lookup every
backend that ships measured plans uses.

A table measured on one card serves every card whose key equals it, and — where no
table was measured on a card — the nearest table of the same architecture
(:meth:`CardKey.nearest`: the same bandwidth class first, then the nearest SM count), so
an H200 takes the H100's table rather than none. A card of another architecture (an
sm_80 A100 beside sm_90 tables) gets no table: the backend's rule applies.

Tables shipped as JSON hold their card under ``"card"`` (the four fields of
:class:`CardKey`) beside whatever the backend stores; tables written as Python literals
key their dicts by a :class:`CardKey` directly (:data:`H100_SXM` for the ones measured on
the H100 SXM).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..errors import InvalidArgumentError
from ..files import read_json
from .card import CardKey, card_key

__all__ = ["H100_SXM", "card_fields", "card_of", "cuda_card", "nearest_key", "read_card_json", "table_for"]

T = TypeVar("T")

#: The H100 SXM (80 GB HBM3): sm_90, 132 SMs, 227 KiB of shared memory a block may opt
#: in to, 3.35 TB/s nominal (class 3) — the card most shipped tables were measured on.
H100_SXM = CardKey("sm_90", 132, 227, 3)


def nearest_key(keys: Mapping[CardKey, Any], card: CardKey | None) -> CardKey | None:
    """The key of ``keys`` that serves ``card``: itself, else the nearest of its
    architecture, else None (no card, or no table of its architecture)."""
    if card is None:
        return None
    if card in keys:
        return card
    return card.nearest(keys)


def table_for(tables: Mapping[CardKey, T], card: CardKey | None) -> T | None:
    """The table that serves ``card`` (see :func:`nearest_key`), or None."""
    key = nearest_key(tables, card)
    return tables[key] if key is not None else None


def card_fields(card: CardKey) -> dict[str, Any]:
    """The ``"card"`` object a JSON table stores (what :func:`read_card_json` reads back)."""
    return dataclasses.asdict(card)


def read_card_json(path: Path) -> tuple[CardKey, dict[str, Any]]:
    """A JSON table's card and the whole document; the card is checked where it enters."""
    data = read_json(path, error=InvalidArgumentError)
    card = data.get("card") if isinstance(data, dict) else None
    names = {f.name for f in dataclasses.fields(CardKey)}
    if not isinstance(card, dict) or set(card) != names:
        raise InvalidArgumentError(
            f"{path}: expected a JSON object with \"card\": {{{', '.join(sorted(names))}}} (a tuned table keyed by "
            f"card features), got {type(data).__name__} with card {card!r}")
    try:
        key = CardKey(arch=str(card["arch"]), sms=int(card["sms"]), smem_kib=int(card["smem_kib"]),
                      bandwidth_class=int(card["bandwidth_class"]))
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{path}: card {card!r}: {exc}") from exc
    return key, data


@functools.lru_cache(maxsize=16)
def _cuda_card(index: int) -> CardKey:
    return card_key(index)


def cuda_card(device: Any) -> CardKey:
    """The key of a CUDA device (``torch.device``, or None for the current one), read once
    per device index."""
    import torch

    device = torch.device("cuda") if device is None else torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_card(index)


def card_of(device: Any) -> CardKey | None:
    """:func:`cuda_card` of a CUDA device; None for any other device and under Triton's
    interpreter, where no tuned table applies."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return None
    return cuda_card(device)
