"""The one lookup of tuned tables by card features (quantcore/probe/card_tables.py), and
that every backend that ships a table answers through it: a fake H200's device properties
pick the H200's own table where a backend ships one and the nearest (the H100's) where not,
an sm_80 card gets each backend's rule."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from quantcore.errors import InvalidArgumentError
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.probe.card import CardKey, key_of_properties
from quantcore.probe.card_tables import (
    H100_SXM,
    card_fields,
    card_of,
    nearest_key,
    read_card_json,
    table_for,
)


def _props(major: int, minor: int, sms: int, smem: int, clock_khz: int, bus_bits: int) -> SimpleNamespace:
    return SimpleNamespace(major=major, minor=minor, multi_processor_count=sms, shared_memory_per_block_optin=smem,
                           memory_clock_rate=clock_khz, memory_bus_width=bus_bits)


#: What torch.cuda.get_device_properties says on each card (the H100's and H200's as measured).
H100 = key_of_properties(_props(9, 0, 132, 232448, 2619000, 5120))
H200 = key_of_properties(_props(9, 0, 132, 232448, 3201000, 6144))
H100_PCIE = key_of_properties(_props(9, 0, 114, 232448, 1593000, 5120))
A100 = key_of_properties(_props(8, 0, 108, 166912, 1593000, 5120))


def test_the_shipped_card_is_the_h100s_properties() -> None:
    assert H100 == H100_SXM
    assert H200 != H100_SXM and H200.arch == H100_SXM.arch


def test_nearest_rule() -> None:
    tables = {H100_SXM: "h100"}
    assert table_for(tables, H100) == "h100"
    assert table_for(tables, H200) == "h100"  # no H200 table: the H100's, not none
    assert table_for(tables, H100_PCIE) == "h100"
    assert table_for(tables, A100) is None  # another architecture: the backend's rule
    assert table_for(tables, None) is None  # the CPU, the interpreter
    both = {H100_SXM: "h100", CardKey("sm_90", 132, 227, 4): "h200"}
    assert table_for(both, H200) == "h200" and table_for(both, H100) == "h100"
    assert nearest_key(both, CardKey("sm_90", 132, 227, 5)) == CardKey("sm_90", 132, 227, 4)


def test_card_json_round_trip_and_refusals(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"card": card_fields(H200), "entries": [1]}))
    card, data = read_card_json(path)
    assert card == H200 and data["entries"] == [1]
    path.write_text(json.dumps([{"device": "NVIDIA H100 80GB HBM3"}]))
    with pytest.raises(InvalidArgumentError, match=r"t\.json: expected a JSON object with \"card\""):
        read_card_json(path)
    path.write_text(json.dumps({"card": {"arch": "sm_90", "sms": 132}}))
    with pytest.raises(InvalidArgumentError, match="bandwidth_class"):
        read_card_json(path)
    path.write_text(json.dumps({"card": {**card_fields(H200), "sms": "many"}}))
    with pytest.raises(InvalidArgumentError, match="many"):
        read_card_json(path)


def test_no_card_off_cuda() -> None:
    assert card_of("cpu") is None and card_of(torch.device("cpu")) is None


def test_svdquant_tiles_by_card() -> None:
    from quantcore.kernels.svdquant.configs import SHIPPED, shipped_tile, tables

    fmt = SVDQuantAct(fp4=True)
    args = (fmt, 4352, 3840, 32, torch.bfloat16, True)
    tile = shipped_tile(H100, *args)
    # The H100's table: the built-in one with the measured tuned-<card>.json laid over it.
    assert tile is not None and tile in tables()[H100_SXM].values()
    assert set(SHIPPED[H100_SXM]) <= set(tables()[H100_SXM])
    assert shipped_tile(H200, *args) == tile
    assert shipped_tile(A100, *args) is None and shipped_tile(None, *args) is None


def test_trtllm_moe_tiles_by_card() -> None:
    from quantcore.backends.trtllm_moe.tiles import RULE, TABLES, tile_table

    assert tile_table(H100) is TABLES[H100_SXM]
    assert tile_table(H200) is TABLES[H100_SXM]
    assert tile_table(A100) is RULE


def test_turboquant_and_triton_int4_by_card() -> None:
    from quantcore.backends.triton_int4.configs import Shape, default_plan, plan_for
    from quantcore.backends.turboquant_triton import configs

    # Each card its own measured table (the H200's tuned on an H200), an sm_80 card none.
    tables = configs.tables()
    assert configs.table(H200) is tables[H200] and configs.table(H100) is tables[H100_SXM] is not tables[H200]
    assert configs.table(A100) == {}
    shape = Shape(1, 4096, 4096, 4, 4, "bf16")
    assert plan_for(shape, H200) == plan_for(shape, H100) != default_plan(shape, 132)
    assert plan_for(shape, A100) == default_plan(shape, 108)
