"""Checkpoints written in the real on-disk layout, read back through quantcore; and
malformed ones, whose errors name the tensor and what was expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from quantcore.checkpoint import (
    QuantLinear,
    load_checkpoint,
    quantize_linears,
    replace_linears,
    save_checkpoint,
)
from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.errors import TensorFormatError
from quantcore.formats.awq import AWQ, pack_awq
from quantcore.formats.gptq import GPTQ
from quantcore.ops.linear import linear_reference

safetensors = pytest.importorskip("safetensors.torch")


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(256, 128), nn.GELU(), nn.Linear(128, 64, bias=False), nn.LayerNorm(64))


def _write(tmp_path: Path, fmt, **kw) -> tuple[Path, nn.Module, dict]:
    model = _model()
    linears = quantize_linears(model, fmt, ["0", "2"], **({"generator": torch.Generator().manual_seed(0)} if isinstance(fmt, GPTQ) else {}))
    others = {k: v for k, v in model.state_dict().items() if k.startswith("3.")}
    save_checkpoint(tmp_path, fmt, linears, others, **kw)
    return tmp_path, model, linears


@pytest.mark.parametrize(
    ("fmt", "kw"),
    [
        (GPTQ(bits=4, group_size=64, sym=False, desc_act=True), {}),
        (GPTQ(bits=3, group_size=32, checkpoint_format="v1"), {"config_file": "quantize_config.json"}),
        (GPTQ(bits=8, group_size=-1, static_groups=True, desc_act=True), {"shards": 3}),
        (GPTQ(bits=4, group_size=128, pack_dtype=torch.int16), {}),
        (AWQ(group_size=64), {"base_config": {"model_type": "toy"}}),
    ],
    ids=lambda v: v.slug if hasattr(v, "slug") else "",
)
def test_round_trip_through_disk(tmp_path: Path, fmt, kw) -> None:
    folder, _, linears = _write(tmp_path, fmt, **kw)
    ckpt = load_checkpoint(folder)
    assert ckpt.format == fmt
    assert sorted(ckpt.linears) == ["0", "2"] and sorted(ckpt.others) == ["3.bias", "3.weight"]
    for name, tensors in linears.items():
        assert all(torch.equal(ckpt.linears[name][k], v) for k, v in tensors.items())
    x = torch.randn(3, 256)
    layer = QuantLinear(ckpt.format, ckpt.linears["0"], dtype=torch.float32)
    golden = linear_reference(x, fmt.dequantize(ckpt.linears["0"]), ckpt.linears["0"]["bias"])
    assert compare(layer(x), golden, tolerance_for(torch.float32)).ok
    if isinstance(fmt, AWQ) or fmt.bits == 4:  # other widths: whatever plain kernel ranks first
        assert layer.kernel.name == ("awq_cpu" if isinstance(fmt, AWQ) else "aten_cpu")


def test_replace_linears_runs_the_model(tmp_path: Path) -> None:
    fmt = GPTQ(bits=4, group_size=64, sym=False)
    folder, model, _ = _write(tmp_path, fmt)
    quant = _model()
    swapped = replace_linears(quant, load_checkpoint(folder), dtype=torch.float32)
    assert sorted(swapped) == ["0", "2"] and isinstance(quant[0], QuantLinear)
    x = torch.randn(4, 256)
    ref, got = model(x), quant(x)
    cos = torch.nn.functional.cosine_similarity(ref, got).min()
    assert cos > 0.99
    assert "kernel=aten_cpu" in repr(quant[0])


def test_autoawq_quant_config_json(tmp_path: Path) -> None:
    """AutoAWQ's own file: quant_config.json with w_bit / q_group_size / version 'GEMM'."""
    fmt = AWQ(group_size=128)
    t = fmt.quantize(torch.randn(64, 256) * 0.05)
    safetensors.save_file({f"model.layers.0.mlp.{k}": v for k, v in t.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "quant_config.json").write_text(json.dumps({"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}))
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.format == fmt and ckpt.config_file == "quant_config.json"
    assert list(ckpt.linears) == ["model.layers.0.mlp"]


# --- malformed checkpoints -----------------------------------------------------------


def _gptq_dir(tmp_path: Path, mutate=None, config: dict | None = None) -> Path:
    fmt = GPTQ(bits=4, group_size=64, sym=False)
    t = dict(fmt.quantize(torch.randn(64, 256) * 0.05))
    if mutate:
        mutate(t)
    safetensors.save_file({f"layer.{k}": v.contiguous() for k, v in t.items()}, str(tmp_path / "model.safetensors"))
    cfg = {"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": False, "desc_act": False, **(config or {})}
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": cfg}))
    return tmp_path


@pytest.mark.parametrize(
    ("mutate", "config", "match"),
    [
        (lambda t: t.pop("qzeros"), None, r"layer\.qzeros: belongs to a quantized linear|missing tensor\(s\) qzeros"),
        (lambda t: t.pop("scales"), None, r"layer: .*missing tensor\(s\) scales"),
        (lambda t: t.update(scales=t["scales"][:, :32]), None, r"layer: .*scales: expected shape \(4, 64\), got \(4, 32\)"),
        (lambda t: t.update(qzeros=t["qzeros"].to(torch.int16)), None, r"layer: .*qzeros: expected dtype int32, got \(4, 8\) int16"),
        (lambda t: t.update(scales=t["scales"].to(torch.int32)), None, r"layer: .*scales: expected dtype float16 or bfloat16 or float32"),
        (None, {"bits": 5}, r"bits: expected one of \(2, 3, 4, 8\), got 5"),
        (None, {"bits": 8}, r"layer: the config says bits=8, but layer\.qweight has 32 rows of torch\.int32 for 256 inputs .* 4 bits"),
        (None, {"group_size": 96}, r"layer: the config says group_size=96, but it does not divide in_features=256"),
        (None, {"group_size": 128}, r"layer: the config says group_size=128, but layer\.scales has 4 groups for 256 inputs \(group_size 64\)"),
        (lambda t: t.update(g_idx=t["g_idx"].flip(0)), None, r"layer: .*g_idx: desc_act=False expects g_idx\[i\] = i // 64"),
        (None, {"quant_method": "bitsandbytes"}, r"quant_method 'bitsandbytes' is not supported"),
        (None, {"dynamic": {"+:.*": {"bits": 8}}}, r"'dynamic' per-module overrides are not supported"),
    ],
)
def test_malformed(tmp_path: Path, mutate, config, match: str) -> None:
    folder = _gptq_dir(tmp_path, mutate, config)
    with pytest.raises(TensorFormatError, match=match):
        load_checkpoint(folder)


def test_missing_config_and_files(tmp_path: Path) -> None:
    with pytest.raises(TensorFormatError, match="no quantization config found"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}))
    with pytest.raises(TensorFormatError, match=r"no \*\.safetensors files"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq", "group_size": 128}}))
    with pytest.raises(TensorFormatError, match="missing 'bits'"):
        load_checkpoint(tmp_path)


def test_awq_bits_disagreement(tmp_path: Path) -> None:
    t = AWQ(group_size=64).quantize(torch.randn(64, 256) * 0.05)
    t["qweight"] = pack_awq(torch.zeros(256, 32, dtype=torch.int32))  # 32 outputs' worth of lanes
    safetensors.save_file({f"proj.{k}": v for k, v in t.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 64}}))
    with pytest.raises(TensorFormatError, match=r"proj: the config says bits=4, but proj\.qweight packs 64 outputs .* 2 bits per output"):
        load_checkpoint(tmp_path)


def test_checkpoint_linear_must_match_the_model(tmp_path: Path) -> None:
    folder, _, _ = _write(tmp_path, GPTQ(bits=4, group_size=64))
    other = nn.Sequential(nn.Linear(256, 64), nn.GELU(), nn.Linear(128, 64))
    with pytest.raises(TensorFormatError, match=r"0: checkpoint linear is 256→128, the model's is 256→64"):
        replace_linears(other, load_checkpoint(folder))
