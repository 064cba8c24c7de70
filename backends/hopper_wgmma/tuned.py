"""Plans measured per card, shipped as ``tuned-<card>.json`` beside this file (written by
``tools/probes/hopper_wgmma_sweep.py --table``: the fastest correct candidate per
``(bits, K, N, M)``, CUDA-graph replays, bf16, GPTQ g128), keyed by
:class:`~quantcore.probe.card.CardKey`."""

from __future__ import annotations

import functools
from pathlib import Path

from quantcore.probe.card import CardKey
from quantcore.probe.card_tables import read_card_json

from .plans import AnyPlan, plan_from_dict

__all__ = ["TABLES", "load_tables"]

Table = dict[tuple[int, int, int, int], AnyPlan]


def parse_table(data: dict) -> tuple[CardKey, Table]:
    card = CardKey(**data["card"])
    plans = {(e["bits"], e["k"], e["n"], e["m"]): plan_from_dict(e["plan"]) for e in data["plans"]}
    return card, plans


@functools.cache
def load_tables(folder: Path = Path(__file__).parent) -> dict[CardKey, Table]:
    tables: dict[CardKey, Table] = {}
    for path in sorted(folder.glob("tuned-*.json")):
        card, data = read_card_json(path)
        tables[card] = parse_table(data)[1]
    return tables


TABLES = load_tables()
