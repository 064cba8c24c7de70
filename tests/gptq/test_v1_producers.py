"""GPTQ v1 checkpoints read as their writer wrote them, with zero points of 0 in the lanes;
refused, until the caller names the rule, where the config does not say who wrote them.

The writers are emulated here with plain Python integers, independent of quantcore's
packing: GPTQModel's export (the whole v2 lane minus 0x…1111, borrows and all),
quantcore's per-field writer, and AutoGPTQ ≤ 0.7's packer (``(z − 1)`` cast to uint32
and OR-ed in shifted, so a −1 sets every field above it)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch

from quantcore.checkpoint import load_checkpoint, save_checkpoint
from quantcore.checkpoint.producer import detect_producer
from quantcore.errors import InvalidArgumentError, QuantCoreWarning, TensorFormatError
from quantcore.formats.gptq import GPTQ
from quantcore.formats.gptq.convert import zero_to_stored
from quantcore.formats.packing import pack_codes

pytest.importorskip("safetensors")

K, N, GS = 128, 64, 32


def _lanes(zeros: torch.Tensor, bits: int, width: int, writer: str) -> torch.Tensor:
    """qzeros [G, N·b/W] as ``writer`` packs true zero points ``zeros [G, N]``."""
    per = width // bits
    rows = []
    for g in range(zeros.shape[0]):
        row = []
        for lane in range(zeros.shape[1] // per):
            z = [int(v) for v in zeros[g, lane * per:(lane + 1) * per]]
            if writer == "gptqmodel":
                value = (sum(v << (bits * j) for j, v in enumerate(z)) - sum(1 << (bits * j) for j in range(per))) % (1 << width)
            elif writer == "fields":
                value = sum(((v - 1) % (1 << bits)) << (bits * j) for j, v in enumerate(z))
            else:  # autogptq <= 0.7: uint32(z - 1) << shift, OR-ed
                value = 0
                for j, v in enumerate(z):
                    value |= ((v - 1) % (1 << width)) << (bits * j)
                value %= 1 << width
            row.append(value - (1 << width) if value >= 1 << (width - 1) else value)
        rows.append(row)
    return torch.tensor(rows, dtype={32: torch.int32, 16: torch.int16, 8: torch.int8, 64: torch.int64}[width])


def _checkpoint(tmp_path: Path, bits: int, writer: str, meta: object, pack_dtype: torch.dtype = torch.int32):
    fmt = GPTQ(bits=bits, group_size=GS, sym=False, checkpoint_format="v1", pack_dtype=pack_dtype)
    gen = torch.Generator().manual_seed(bits)
    tensors = fmt.quantize(torch.randn(N, K, generator=gen) * 0.05, generator=gen)
    zeros = torch.randint(0, 2**bits, (K // GS, N), generator=gen)
    zeros[:, 0::4] = 0  # a zero of 0 in every lane, at low and high fields
    zeros[0, :] = 0  # and lanes of nothing but zeros of 0
    width = {torch.int8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}[pack_dtype]
    tensors["qzeros"] = _lanes(zeros, bits, width, writer)
    save_checkpoint(tmp_path, fmt, {"layer": tensors}, config_file="quantize_config.json")
    cfg_path = tmp_path / "quantize_config.json"
    cfg = json.loads(cfg_path.read_text())
    if meta is None:
        cfg.pop("meta")
    else:
        cfg["meta"] = meta
    cfg_path.write_text(json.dumps(cfg))
    truth = ((fmt.unpack_weight(tensors) - zeros[fmt.group_index(tensors)]) * tensors["scales"][fmt.group_index(tensors)].double()).T
    return truth, zeros


def _read(tmp_path: Path) -> tuple[torch.Tensor, torch.Tensor, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = load_checkpoint(tmp_path)
    tensors = ckpt.linears["layer"]
    dense = ckpt.format.dequantize(tensors)
    return dense, ckpt.format.unpack_zeros(tensors), [w for w in caught if issubclass(w.category, QuantCoreWarning)]


@pytest.mark.parametrize("pack_dtype", [torch.int32, torch.int16, torch.int64])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("meta", [{"quantizer": ["gptqmodel:2.2.0"]}, {"quantizer": "autogptq:0.8.0.dev1"}],
                         ids=["gptqmodel", "autogptq-0.8"])
def test_lane_writers_are_read_with_lane_arithmetic(tmp_path: Path, bits: int, pack_dtype: torch.dtype, meta) -> None:
    truth, zeros = _checkpoint(tmp_path, bits, "gptqmodel", meta, pack_dtype)
    dense, read_zeros, warned = _read(tmp_path)
    assert torch.equal(read_zeros, zeros.int()) and torch.equal(dense, truth) and not warned


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_quantcores_own_v1_is_read_field_by_field_silently(tmp_path: Path, bits: int) -> None:
    fmt = GPTQ(bits=bits, group_size=GS, sym=False, checkpoint_format="v1")
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(N, K, generator=gen) * 0.05
    weight[:, :GS] += 0.2  # groups whose minimum is 0: zero points of 0
    tensors = fmt.quantize(weight, generator=gen)
    assert (fmt.unpack_zeros(tensors) == 0).any()
    save_checkpoint(tmp_path, fmt, {"layer": tensors})
    assert detect_producer(json.loads((tmp_path / "config.json").read_text())["quantization_config"]).name == "quantcore"
    dense, _, warned = _read(tmp_path)
    assert torch.equal(dense, fmt.dequantize(tensors)) and not warned


def _read_with(tmp_path: Path, rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    ckpt = load_checkpoint(tmp_path, v1_zeros=rule)
    tensors = ckpt.linears["layer"]
    return ckpt.format.dequantize(tensors), ckpt.format.unpack_zeros(tensors)


def test_an_unnamed_producer_with_ambiguous_lanes_is_refused_until_the_rule_is_named(tmp_path: Path) -> None:
    truth, zeros = _checkpoint(tmp_path, 4, "gptqmodel", None)
    with pytest.raises(TensorFormatError) as refused:
        load_checkpoint(tmp_path)
    message = str(refused.value)
    assert "\n" not in message and "quantize_config.json" in message and "layer.qzeros" in message
    assert "names no producer" in message and "v1_zeros='lanes'" in message and "v1_zeros='fields'" in message
    # Named, the lanes GPTQModel wrote are read exactly.
    dense, read_zeros = _read_with(tmp_path, "lanes")
    assert torch.equal(read_zeros, zeros.int()) and torch.equal(dense, truth)
    # Field by field, a GPTQModel lane reads one too low wherever the subtraction borrowed
    # into a field: just above a zero of 0, and on up while the borrow ripples — what a
    # guess would have loaded.
    expected = torch.empty_like(zeros)
    for g in range(zeros.shape[0]):
        for lane in range(0, N, 8):
            borrow = 0
            for j in range(lane, lane + 8):
                v = int(zeros[g, j]) - 1 - borrow
                borrow = int(v < 0)
                expected[g, j] = ((v % 16) + 1) % 16
    dense_fields, read_fields = _read_with(tmp_path, "fields")
    assert torch.equal(read_fields, expected.int())
    assert int((read_fields != zeros.int()).sum()) > 0 and not torch.equal(dense_fields, truth)
    # The same lanes written field by field: refused alike, read exactly with their rule.
    truth2, zeros2 = _checkpoint(tmp_path, 4, "fields", None)
    with pytest.raises(TensorFormatError, match="names no producer"):
        load_checkpoint(tmp_path)
    dense2, read2 = _read_with(tmp_path, "fields")
    assert torch.equal(read2, zeros2.int()) and torch.equal(dense2, truth2)


def test_an_unnamed_producer_without_ambiguous_lanes_loads(tmp_path: Path) -> None:
    fmt = GPTQ(bits=4, group_size=GS, sym=False, checkpoint_format="v1")
    gen = torch.Generator().manual_seed(3)
    tensors = fmt.quantize(torch.randn(N, K, generator=gen) * 0.05, generator=gen)
    fields = fmt.unpack_zeros(tensors)
    fields[fields == 0] = 1  # no zero point of 0 anywhere: every rule reads the same numbers
    tensors["qzeros"] = pack_codes(zero_to_stored(fields, fmt), 4, dim=1)
    save_checkpoint(tmp_path, fmt, {"layer": tensors}, config_file="quantize_config.json")
    cfg_path = tmp_path / "quantize_config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "meta": None}))
    dense, read_zeros, warned = _read(tmp_path)
    assert torch.equal(read_zeros, fields) and torch.equal(dense, fmt.dequantize(tensors)) and not warned


def test_autogptq_legacy_lanes_are_refused_and_say_why(tmp_path: Path) -> None:
    _, zeros = _checkpoint(tmp_path, 4, "autogptq", None)
    with pytest.raises(TensorFormatError, match=r"AutoGPTQ <= 0\.7 overwrote the fields above"):
        load_checkpoint(tmp_path)
    # Read field by field (its rule), every field above a zero of 0 in its lane was
    # overwritten with ones: it reads as 0.
    _, read_zeros = _read_with(tmp_path, "fields")
    lanes = zeros.view(zeros.shape[0], -1, 8)
    above = (lanes == 0).int().cumsum(dim=-1) > 0
    assert torch.equal(read_zeros.view_as(lanes)[above], torch.zeros(int(above.sum()), dtype=torch.int32))
    assert (lanes[above] != 0).any()  # so information was lost there


def test_v1_zeros_is_checked(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 4, "gptqmodel", None)
    with pytest.raises(InvalidArgumentError, match="v1_zeros: expected one of"):
        load_checkpoint(tmp_path, v1_zeros="guess")
    fmt = GPTQ(bits=3, group_size=GS, sym=False, checkpoint_format="v1")
    save_checkpoint(tmp_path, fmt, {"layer": fmt.quantize(torch.randn(N, K) * 0.05)})
    with pytest.raises(InvalidArgumentError, match="3-bit v1 fields straddle lanes"):
        load_checkpoint(tmp_path, v1_zeros="lanes")


def test_detect_producer_reads_the_forms_tools_write() -> None:
    assert detect_producer({"meta": {"quantizer": ["gptqmodel:1.4.5", "other:1"]}}).name == "gptqmodel"
    assert detect_producer({"meta": {"quantizer": "auto_gptq:0.8.0"}}).name == "autogptq"
    assert detect_producer({"meta": {"quantizer": "GPTQModel:0.9.9"}}).version == "0.9.9"
    assert detect_producer({}).name == "" and detect_producer({"meta": "x"}).name == ""
