"""Where ``turboquant_triton`` takes the ``mma.sync`` decode kernel: only where the card's
own table names it for the layer (K, N, group, passes, dtype or its 16-bit twin) and the
call's rows (an ``m`` = 1 entry for one row, ``m`` = 8 for two to eight), never for
another card, another shape, more rows than the MMA's N, or a call with a running partial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from quantcore.backends.turboquant_triton import configs, fused
from quantcore.errors import InvalidArgumentError
from quantcore.probe.card import CardKey

H200 = CardKey(arch="sm_90", sms=132, smem_kib=227, bandwidth_class=4)
H100 = CardKey(arch="sm_90", sms=132, smem_kib=227, bandwidth_class=3)
EIGHT = configs.MmaDecodeConfig(split=8, tiles=2, copies=32)
ONE = configs.MmaDecodeConfig(split=4, tiles=1, copies=16)


@pytest.fixture
def h200_table(monkeypatch: pytest.MonkeyPatch) -> None:
    table = {("mma_decode", 14336, 4096, 128, 2, "bfloat16", 8): EIGHT,
             ("mma_decode", 14336, 4096, 128, 2, "bfloat16", 1): ONE}
    monkeypatch.setattr(configs, "tables", lambda: {H200: table, H100: {}})


@pytest.mark.usefixtures("h200_table")
@pytest.mark.parametrize(("m", "want"), [(1, ONE), (2, EIGHT), (8, EIGHT), (9, None), (0, None)])
def test_rows_pick_the_entry_of_their_bucket(m: int, want: configs.MmaDecodeConfig | None) -> None:
    assert configs.mma_decode_config(H200, m, 14336, 4096, 128, 2, torch.bfloat16) == want


@pytest.mark.usefixtures("h200_table")
def test_fp16_takes_the_bf16_entry_and_nothing_else_stands_in() -> None:
    assert configs.mma_decode_config(H200, 3, 14336, 4096, 128, 2, torch.float16) == EIGHT
    assert configs.mma_decode_config(H200, 3, 14336, 4096, 128, 1, torch.bfloat16) is None  # one pass
    assert configs.mma_decode_config(H200, 3, 4096, 14336, 128, 2, torch.bfloat16) is None  # another shape
    assert configs.mma_decode_config(H200, 3, 14336, 4096, 64, 2, torch.bfloat16) is None  # another group
    assert configs.mma_decode_config(H100, 3, 14336, 4096, 128, 2, torch.bfloat16) is None  # another card
    assert configs.mma_decode_config(None, 3, 14336, 4096, 128, 2, torch.bfloat16) is None  # CPU, interpreter


@pytest.mark.usefixtures("h200_table")
def test_the_call_takes_the_path_only_without_a_running_partial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "_card", lambda device: H200)
    monkeypatch.setattr(fused, "_paths", {})  # the path thresholds this card's table gives, not kept after
    monkeypatch.setattr(fused, "_gluon_ok", lambda device: True)  # a CUDA device whose Triton compiles Gluon
    device = torch.device("cpu")
    assert fused.default_path(5, torch.bfloat16, 14336, 4096, 2, 128, False, device) == ("mma_decode", EIGHT)
    assert fused.default_path(5, torch.bfloat16, 14336, 4096, 2, 128, True, device)[0] == "mma"
    assert fused.default_path(1, torch.bfloat16, 14336, 4096, 1, 128, False, device) == ("gemv", None)
    assert fused.default_path(9, torch.bfloat16, 14336, 4096, 2, 128, False, device)[0] == "mma"


@pytest.mark.usefixtures("h200_table")
@pytest.mark.parametrize(("version", "taken"), [("3.6.0", True), ("3.8.0", False)])
def test_the_path_is_not_taken_where_triton_does_not_compile_its_gluon(
        monkeypatch: pytest.MonkeyPatch, version: str, taken: bool) -> None:
    from quantcore.probe import Capabilities, PackageStatus

    caps = Capabilities(device="cuda:0", device_type="cuda", available=True, compute_capability=(9, 0),
                        torch_version=torch.__version__, packages=(PackageStatus("triton", version, True),))
    monkeypatch.setattr(fused, "probe", lambda device: caps)
    monkeypatch.setattr(fused, "_gluon_compiles", {})
    monkeypatch.setattr(fused, "_card", lambda device: H200)
    monkeypatch.setattr(fused, "_paths", {})
    path = fused.default_path(5, torch.bfloat16, 14336, 4096, 2, 128, False, torch.device("cpu"))
    assert path == (("mma_decode", EIGHT) if taken else ("mma", None))


def test_a_table_file_holds_mma_decode_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    card = {"arch": "sm_90", "sms": 7, "smem_kib": 227, "bandwidth_class": 4}
    entry = {"kernel": "mma_decode", "K": 4096, "N": 4096, "d": 128, "passes": 1, "dtype": "bfloat16", "m": 8,
             "config": {"split": 4, "tiles": 2, "copies": 32}}
    path = tmp_path / "extra.json"
    path.write_text(json.dumps({"card": card, "entries": [entry]}))
    monkeypatch.setenv(configs.ENV, str(path))
    key = CardKey(**card)
    assert configs.mma_decode_config(key, 8, 4096, 4096, 128, 1, torch.bfloat16) == configs.MmaDecodeConfig(4, 2, 32)
    path.write_text(json.dumps({"card": card, "entries": [{**entry, "m": None, "config": {"split": "x", "rows": 1}}]}))
    configs._tables.cache_clear()
    with pytest.raises(InvalidArgumentError, match="not a tuned config"):
        configs.tables()
    configs._tables.cache_clear()


def test_asked_for_on_a_cpu_it_says_where_it_runs() -> None:
    from quantcore.formats.turboquant import TurboQuant

    from .cuda_layers import quantized_layer

    fmt = TurboQuant(group_size=128)
    prep = fused_prepared(fmt, quantized_layer(fmt, 64, 256, seed=1))
    with pytest.raises(ValueError, match="a CUDA GPU, not the interpreter"):
        fused.fused_linear(torch.randn(2, 256), prep.passes, prep.codebook, group_size=128, partial=None,
                           bias=prep.bias, out_dtype=torch.float32, path="mma_decode")


def fused_prepared(fmt: object, t: dict[str, torch.Tensor]) -> object:
    from quantcore.backends.turboquant_triton import TurboQuantTriton

    return TurboQuantTriton(fmt, "cpu").prepare(t, dtype=torch.float32)
