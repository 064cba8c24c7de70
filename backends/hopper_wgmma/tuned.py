"""Plans measured per card, shipped as ``tuned-<card>.json`` beside this file (written by
``tools/probes/hopper_wgmma_sweep.py --table``: the fastest correct candidate per
``(bits, K, N, M)``, CUDA-graph replays, bf16, GPTQ g128), keyed by
:class:`~quantcore.probe.card.CardKey`. A row whose plan cannot end gated (a Triton plan)
may also name under ``"gated"`` the fastest plan of that row that can: the one a fused
gate/up layer's gated call takes (``launch.gated_linear``)."""

from __future__ import annotations

import functools
from pathlib import Path

from quantcore.probe.card import CardKey
from quantcore.probe.card_tables import read_card_json

from .plans import AnyPlan, plan_from_dict

__all__ = ["TABLES", "load_gated_tables", "load_tables"]

Table = dict[tuple[int, int, int, int], AnyPlan]


def parse_table(data: dict, field: str = "plan") -> tuple[CardKey, Table]:
    """The card and the plans of its rows that hold ``field`` ("plan", or "gated")."""
    card = CardKey(**data["card"])
    plans = {(e["bits"], e["k"], e["n"], e["m"]): plan_from_dict(e[field]) for e in data["plans"] if field in e}
    return card, plans


@functools.cache
def _load(folder: Path, field: str) -> dict[CardKey, Table]:
    tables: dict[CardKey, Table] = {}
    for path in sorted(folder.glob("tuned-*.json")):
        card, data = read_card_json(path)
        tables[card] = parse_table(data, field)[1]
    return tables


def load_tables(folder: Path = Path(__file__).parent) -> dict[CardKey, Table]:
    return _load(folder, "plan")


def load_gated_tables(folder: Path = Path(__file__).parent) -> dict[CardKey, Table]:
    """Each card's rows' ``"gated"`` plans (module docstring)."""
    return _load(folder, "gated")


TABLES = load_tables()
