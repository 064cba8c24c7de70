"""What no quantcore kernel runs is refused by name before a tensor is read (the shard
here is not even a safetensors file), and a layer that disagrees with its config is
refused in one line naming the file, the layer, the tensor and what was expected. The
configs are the package's own objects, dumped as it dumps them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quantcore.checkpoint import load_checkpoint
from quantcore.checkpoint.load import load_quantized
from quantcore.errors import TensorFormatError

from .writer import scheme, tiny_llama, write_checkpoint

pytest.importorskip("safetensors")
pytest.importorskip("transformers")

from compressed_tensors.config import Sparse24BitMaskConfig
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    preset_name_to_scheme,
)


def _int8(**extra: Any) -> QuantizationScheme:
    return QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(num_bits=8, strategy="channel"), **extra)


def _config(groups: dict[str, QuantizationScheme], **extra: Any) -> dict[str, Any]:
    fmt = extra.pop("format", "pack-quantized")
    cfg = QuantizationConfig(config_groups=groups, format=fmt, quantization_status="compressed", **extra)
    return {"quant_method": "compressed-tensors", **cfg.model_dump()}


#: name → (quantization_config, the words the refusal must contain)
REFUSED = {
    "float weights": (_config({"g": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=8, type="float", strategy="channel"))}, format="float-quantized"), ["format", "float-quantized"]),
    "float weights, packed format named": (_config({"g": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=8, type="float", strategy="channel"))}), ["config_groups.g.weights", "type", "float"]),
    "activation quantization": (_config({"g": _int8(input_activations=QuantizationArgs(
        num_bits=8, strategy="token", dynamic=True))}), ["config_groups.g", "input_activations"]),
    "per-tensor scales": (_config({"g": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=8, strategy="tensor"))}), ["strategy", "'tensor'", "per-tensor scales"]),
    "nvfp4": (_config({"g": preset_name_to_scheme("NVFP4", ["Linear"])}, format="nvfp4-pack-quantized"),
              ["format", "nvfp4-pack-quantized"]),
    "3 bits": (_config({"g": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=3, strategy="group", group_size=32))}), ["num_bits", "3"]),
    "kv cache": (_config({"g": _int8()}, kv_cache_scheme=QuantizationArgs(num_bits=8, type="float", strategy="tensor")),
                 ["kv_cache_scheme", "KV-cache quantization"]),
    "not compressed": ({**_config({"g": _int8()}), "quantization_status": "frozen"}, ["quantization_status", "frozen"]),
}


def _sparse() -> dict[str, Any]:
    return {**_config({"g": _int8()}), "sparsity_config": Sparse24BitMaskConfig().model_dump()}


REFUSED["2:4 sparsity"] = (_sparse(), ["sparsity_config", "2:4", "sparse-24-bitmask"])


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_variants_are_refused_before_a_tensor_is_read(tmp_path: Path, name: str) -> None:
    qcfg, words = REFUSED[name]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": qcfg}))
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file: reading it would fail differently")
    for load in (lambda: load_checkpoint(tmp_path), lambda: load_quantized(tiny_llama(), tmp_path)):
        with pytest.raises(TensorFormatError) as refused:
            load()
        message = str(refused.value)
        assert "\n" not in message and str(tmp_path / "config.json") in message
        for word in words:
            assert word in message, (word, message)
        assert "expected" in message


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("good")
    write_checkpoint(folder, tiny_llama(), {"g": scheme(4, 32, sym=False)}, ignore=["lm_head"])
    return folder


def _copy_with(good: Path, dst: Path, edit) -> Path:
    for file in good.iterdir():
        (dst / file.name).write_bytes(file.read_bytes())
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg["quantization_config"])
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _group(q: dict[str, Any]) -> dict[str, Any]:
    return next(iter(q["config_groups"].values()))


@pytest.mark.parametrize("edit, words", [
    (lambda q: _group(q)["weights"].update(num_bits=8), ["model.safetensors", "weight_packed", "num_bits=8",
                                                         "4 bits per input"]),
    (lambda q: _group(q)["weights"].update(group_size=64), ["model.safetensors", "weight_scale", "expected shape"]),
    (lambda q: _group(q)["weights"].update(symmetric=True), ["model.safetensors", "weight_zero_point",
                                                            "symmetric scheme stores no zero points"]),
    (lambda q: q.update(ignore=[]), ["lm_head.weight_packed", "the config quantizes lm_head",
                                     "holds lm_head.weight"]),
    (lambda q: _group(q).update(targets=["re:.*mlp\\."]), ["self_attn", "weight_packed",
                                                         "no config group targets it"]),
], ids=["bits", "group_size", "symmetric", "ignore", "targets"])
def test_a_layer_that_disagrees_with_its_config_is_refused_in_one_line(good: Path, tmp_path: Path, edit,
                                                                       words: list[str]) -> None:
    folder = _copy_with(good, tmp_path, edit)
    loaders = [lambda: load_quantized(tiny_llama(), folder)]
    if "lm_head" not in words[0]:  # without a model, a layer stored dense is just a dense tensor
        loaders.append(lambda: load_checkpoint(folder))
    for load in loaders:
        with pytest.raises(TensorFormatError) as refused:
            load()
        message = str(refused.value)
        assert "\n" not in message and ("layers." in message or "lm_head" in message)
        for word in words:
            assert word in message, (word, message)
