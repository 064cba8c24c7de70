"""Compressed-tensors checkpoints written by the ``compressed-tensors`` package itself, the
way llm-compressor writes them: the package's ``apply_quantization_config`` attaches each
group's scheme, its ``calculate_qparams`` gives the scales and zero points (min-max, as
llm-compressor's default observer), its ``ModelCompressor`` packs the weights and
``update_config`` writes the ``quantization_config`` into ``config.json``.

Act-order (``weight_g_idx``) is the one thing the installed release no longer writes
(``actorder="group"`` was removed from it); for those layers the package's own
``quantize`` and ``pack_to_int32`` run on the columns in group order, as its earlier
releases did, and the config records ``actorder: "group"`` as those releases wrote it.
The writer's dequantization (:func:`writer_dequantized`) is the package's
``PackedQuantizationCompressor.decompress`` (in group order for act-order layers).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

ct = pytest.importorskip("compressed_tensors", reason="pip install compressed-tensors (writes the test checkpoints)")

from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

__all__ = ["scheme", "tiny_llama", "write_checkpoint", "writer_dequantized"]


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """A two-layer Llama built from its config (no download), random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model


def scheme(bits: int, group_size: int | None, *, sym: bool = True, targets: list[str] | None = None,
           actorder: bool = False, **extra: Any) -> dict[str, Any]:
    """One config group: integer weights, ``group_size=None`` for the channel strategy."""
    weights = {"num_bits": bits, "type": "int", "symmetric": sym,
               "strategy": "group" if group_size else "channel", "group_size": group_size, **extra}
    return {"targets": targets or ["Linear"], "weights": weights, "act_order": actorder}


def _qparams(weight: torch.Tensor, args: QuantizationArgs, perm: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    w = weight if perm is None else weight[:, perm]
    groups = w.shape[1] // args.group_size if args.strategy == "group" else 1
    by_group = w.reshape(w.shape[0], groups, -1)
    return calculate_qparams(by_group.amin(-1), by_group.amax(-1), args)


def write_checkpoint(folder: Path, model: nn.Module, groups: Mapping[str, dict[str, Any]],
                     ignore: list[str] | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Quantize ``model`` in place with ``groups`` and save it (config.json + safetensors);
    returns each act-order layer's ``weight_g_idx``."""
    gen = torch.Generator().manual_seed(seed)
    act_order = {name for name, g in groups.items() if g.get("act_order")}
    config = QuantizationConfig(
        config_groups={name: QuantizationScheme(targets=g["targets"], weights=QuantizationArgs(**g["weights"]))
                       for name, g in groups.items()},
        ignore=ignore or [], format="pack-quantized",
    )
    apply_quantization_config(model, config)
    g_idx: dict[str, torch.Tensor] = {}
    reordered: dict[str, torch.Tensor] = {}
    names = dict(model.named_modules())
    for name, module in names.items():
        qscheme = getattr(module, "quantization_scheme", None)
        if qscheme is None:
            continue
        args = qscheme.weights
        group = next(n for n, g in config.config_groups.items() if g is qscheme or g == qscheme)
        perm = None
        if group in act_order:
            in_features = module.weight.shape[1]
            perm = torch.randperm(in_features, generator=gen)
            g_idx[name] = torch.empty(in_features, dtype=torch.int32)
            g_idx[name][perm] = (torch.arange(in_features) // args.group_size).to(torch.int32)
        scale, zero = _qparams(module.weight.data, args, perm)
        module.weight_scale.data = scale.to(module.weight_scale.dtype)
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data = zero.to(module.weight_zero_point.dtype)
        if perm is not None:
            reordered[name] = quantize(module.weight.data[:, perm], scale, zero, args, dtype=torch.int8)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    for name, q_in_order in reordered.items():
        module = names[name]
        q = torch.empty_like(q_in_order)
        q[:, torch.argsort(g_idx[name].long(), stable=True)] = q_in_order
        module.weight_packed.data = pack_to_int32(q, module.quantization_scheme.weights.num_bits)
        module.register_parameter("weight_g_idx", nn.Parameter(g_idx[name], requires_grad=False))
    model.save_pretrained(folder)
    compressor.update_config(str(folder))
    if act_order:
        path = folder / "config.json"
        cfg = json.loads(path.read_text())
        ordered = [groups[name]["targets"] for name in act_order]
        # The package names the saved groups itself (group_0, ...): find them by their targets.
        for saved in cfg["quantization_config"]["config_groups"].values():
            if saved["targets"] in ordered:
                saved["weights"]["actorder"] = "group"
        path.write_text(json.dumps(cfg, indent=2))
    return g_idx


def writer_dequantized(folder: Path) -> dict[str, torch.Tensor]:
    """Every quantized layer's weight as the package dequantizes it, by layer name."""
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())["quantization_config"]
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    out = {}
    for name in sorted(n[: -len(".weight_packed")] for n in tensors if n.endswith(".weight_packed")):
        group = _group_of(cfg, name)
        weights = dict(group["weights"])
        order = weights.pop("actorder", None)
        qscheme = QuantizationScheme(targets=group["targets"], weights=QuantizationArgs(**weights))
        layer = {k.rpartition(".")[2]: v for k, v in tensors.items() if k.rpartition(".")[0] == name}
        if order == "group":
            out[name] = _dequantize_in_group_order(layer, qscheme.weights)
        else:
            out[name] = PackedQuantizationCompressor.decompress(layer, qscheme)["weight"]
    return out


def _dequantize_in_group_order(layer: dict[str, torch.Tensor], args: QuantizationArgs) -> torch.Tensor:
    shape = torch.Size(layer["weight_shape"].tolist())
    perm = torch.argsort(layer["weight_g_idx"].long(), stable=True)
    q = unpack_from_int32(layer["weight_packed"], args.num_bits, shape)
    zero = None
    if "weight_zero_point" in layer:
        zero = unpack_from_int32(layer["weight_zero_point"], args.num_bits, (shape[0], layer["weight_scale"].shape[1]),
                                 packed_dim=0)
    w = dequantize(q[:, perm], layer["weight_scale"], zero, args)
    return w[:, torch.argsort(perm)]


def _group_of(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """The package's own rule for the group a layer belongs to."""
    from compressed_tensors.utils.match import match_targets

    by_target = {t: g for g in cfg["config_groups"].values() for t in g["targets"]}
    return by_target[match_targets(name, nn.Linear(1, 1), by_target)[0]]
