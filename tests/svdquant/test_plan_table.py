"""The plan probe's table and the configs that read it, without a GPU: the probe's
``tuned-<card>.json`` keeps the fastest candidate that passed its checks per shape, the
configs lay such a file over the Python table of its card, and a malformed file is
refused with its path named."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from quantcore.errors import InvalidArgumentError
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.kernels.svdquant import configs
from quantcore.kernels.svdquant.tile import Tile
from quantcore.probe.card_tables import H100_SXM, card_fields
from tools.probes.act_quant_lora_plans import candidates, table

FMT = SVDQuantAct(fp4=True)
SHIPPED_BIG = Tile(64, 64, 4, 3, 0, 1, 168, 3)


def _row(tile: Tile, us: float, ok: bool = True, m: int = 4352) -> dict:
    return {"fmt": "nvfp4", "M": m, "N": 3840, "R": 32, "tile": dataclasses.asdict(tile), "us": us, "ok": ok,
            "vs_baseline": 1.0, "copy_share": 0.5}


def test_table_keeps_the_fastest_candidate_that_passed(tmp_path: Path) -> None:
    flat = dataclasses.replace(SHIPPED_BIG, flat=True, prefetch=True)
    wrong = dataclasses.replace(SHIPPED_BIG, red=4)
    small = Tile(16, 64, 4, 3, 528, 1, 128, red=8)
    rows = [_row(SHIPPED_BIG, 30.0), _row(flat, 25.0), _row(wrong, 20.0, ok=False),
            _row(Tile(32, 128), 9.0, m=256), _row(small, 7.5, m=256), {"fmt": "nvfp4", "M": 256, "error": "x"}]
    doc = table(rows, {"card": card_fields(H100_SXM), "device": "test"})
    assert [e["key"] for e in doc["entries"]] == ["nvfp4-N3840-R32-M256-bf16-smooth",
                                                  "nvfp4-N3840-R32-M8192-bf16-smooth"]
    (tmp_path / f"tuned-{H100_SXM.slug}.json").write_text(json.dumps(doc))
    merged = configs.tables(tmp_path)
    assert merged[H100_SXM]["nvfp4-N3840-R32-M8192-bf16-smooth"] == flat  # not the faster one that failed
    assert merged[H100_SXM]["nvfp4-N3840-R32-M256-bf16-smooth"] == small
    # the Python table's other entries stay
    assert merged[H100_SXM]["int4-N3840-R32-M8192-bf16-smooth"] == configs.SHIPPED[H100_SXM][
        "int4-N3840-R32-M8192-bf16-smooth"]
    assert configs.config_key(FMT, 4352, 3840, 32, torch.bfloat16, True) == "nvfp4-N3840-R32-M8192-bf16-smooth"


def test_a_new_cards_table_keeps_the_nearest_cards_other_tiles(tmp_path: Path) -> None:
    """A file measured on a card of its own (an H200 beside the H100's tiles) replaces
    the tiles it measured; every shape it did not measure keeps the nearest card's tile."""
    h200 = dataclasses.replace(H100_SXM, bandwidth_class=H100_SXM.bandwidth_class + 1)
    small = Tile(16, 64, 4, 3, 528, 1, 128, red=8)
    doc = table([_row(small, 7.5, m=256)], {"card": card_fields(h200), "device": "test"})
    (tmp_path / f"tuned-{h200.slug}.json").write_text(json.dumps(doc))
    merged = configs.tables(tmp_path)
    assert merged[h200]["nvfp4-N3840-R32-M256-bf16-smooth"] == small
    assert merged[H100_SXM]["nvfp4-N3840-R32-M256-bf16-smooth"] != small
    others = {k: v for k, v in merged[H100_SXM].items() if k != "nvfp4-N3840-R32-M256-bf16-smooth"}
    assert others and all(merged[h200][k] == v for k, v in others.items())


def test_a_malformed_table_is_refused_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "tuned-bad.json"
    path.write_text(json.dumps({"card": card_fields(H100_SXM), "entries": [{"key": "k", "tile": {"bm": 64, "bx": 1}}]}))
    with pytest.raises(InvalidArgumentError, match=r"tuned-bad.json: an entry is not a tuned tile .*unknown tile fields \['bx'\]"):
        configs.load_table(path)
    path.write_text(json.dumps({"card": card_fields(H100_SXM), "entries": {}}))
    with pytest.raises(InvalidArgumentError, match=r"tuned-bad.json: expected \"entries\""):
        configs.load_table(path)


def test_the_shipped_folder_reads() -> None:
    """Whatever tuned files are committed beside the configs parse, and tiles they name pass
    the kernel's checks."""
    from quantcore.kernels.svdquant.triton_kernel import check_tile

    for table_ in configs.tables().values():
        for key, tile in table_.items():
            check_tile(tile, SVDQuantAct(fp4=key.startswith("nvfp4")), int(key.split("-R")[1].split("-")[0]))


def test_candidates_start_with_the_baseline_and_are_distinct() -> None:
    for m, r in ((4352, 32), (4352, 128), (256, 128)):
        tiles = candidates(SHIPPED_BIG, m, r)
        assert tiles[0] == SHIPPED_BIG and len(set(tiles)) == len(tiles) > 4
        assert any(t.flat and t.prefetch for t in tiles)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the probe's case on the CPU, under the interpreter")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_probe_case_runs_and_flags_the_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """One small case of the probe end to end under the interpreter: every candidate is
    checked against the baseline (exact, same LoRA bits on the same walk, deterministic,
    tickets back at 0) and timed beside the matmul and the copy."""
    from tools.probes import act_quant_lora_plans as probe

    monkeypatch.setattr(probe, "DEVICE", "cpu")
    base = Tile(16, 64, grid=5)
    tiles = [base, dataclasses.replace(base, flat=True, prefetch=True), dataclasses.replace(base, red=4),
             Tile(32, 64, grid=3, flat=True)]
    rows = probe.run_case(True, 40, 128, 16, tiles, 1e9, torch.Generator().manual_seed(0))
    assert [r["baseline"] for r in rows] == [True, False, False, False]
    assert all(r["ok"] and r["codes_scales_exact"] and r["deterministic"] and r["tickets_reset"] for r in rows), rows
    assert [r["lora_bits_expected_equal"] for r in rows] == [True, True, True, False]
    assert all(r["us"] > 0 and r["cublas_us"] > 0 and r["same_size_copy_us"] > 0 for r in rows)
