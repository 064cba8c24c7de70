"""Checkpoint folders as a download, a disk or a hand could leave them.

A small Llama (transformers) is quantized and written once, as three shards with an
index; each example copies the folder and spoils one thing: a shard truncated at a
random byte, emptied, or overwritten with garbage; a config that is a list, null, a
string, non-UTF-8, nested too deep, a FIFO or a folder, or whose quantization fields have
the wrong types; an index whose ``weight_map`` is a list, maps to numbers, or names
files outside the folder (``../``, absolute) or that are not there; a quantized linear's
tensors of another dtype, emptied, flattened or missing; a tensor in two shards. And
some that spoil nothing: the Hugging Face cache's layout (every file a symlink into a
blob folder), an unknown config key.

``load_checkpoint``, ``load_quantized`` (into a skeleton, or building the model from the
folder) and TurboQuant's single-file loader (its metadata spoiled likewise) must refuse
with a quantcore error naming the file, or load a model whose every quantized layer
computes what its tensors, as the eager reader reads them, define.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import quantcore
from quantcore.checkpoint import load_checkpoint
from quantcore.checkpoint.shards import INDEX
from quantcore.errors import QuantCoreError
from quantcore.formats.gptq import GPTQ
from quantcore.nn.linear import QuantLinear
from tests.llama_checkpoint import llama, skeleton, write_quantized

from .fuzz.profiles import examples
from .fuzz.tally import attempt

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

FMT = GPTQ(bits=4, group_size=32, sym=False)
TIMEOUT_S = 120.0


def _config() -> Any:
    return transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False,
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: Any) -> Path:
    folder = tmp_path_factory.mktemp("checkpoint") / "model"
    write_quantized(folder, llama(_config()), FMT, _config(), shards=3)
    return folder


# --- spoiling ---------------------------------------------------------------------------------


def _shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def _edit_tensors(folder: Path, data: st.DataObject, how: str) -> str:
    from safetensors.torch import load_file, save_file

    shard = data.draw(st.sampled_from(_shards(folder)), label="shard")
    tensors = load_file(str(shard))
    quantized = sorted(k for k in tensors if k.rsplit(".", 1)[-1] in ("qweight", "qzeros", "scales", "g_idx"))
    if not quantized:
        return "nothing to edit"
    name = data.draw(st.sampled_from(quantized), label="tensor")
    t = tensors[name]
    if how == "dtype":
        tensors[name] = t.to(data.draw(st.sampled_from((torch.float32, torch.int8, torch.float16, torch.int64))))
    elif how == "emptied":
        tensors[name] = t[:0].contiguous()
    elif how == "flattened":
        tensors[name] = t.reshape(-1).contiguous()
    elif how == "missing":
        del tensors[name]
    save_file(tensors, str(shard))
    return f"{name} {how}"


def _json_value(data: st.DataObject, label: str) -> Any:
    return data.draw(st.sampled_from((None, [], [1], {}, "x", 4.5, -1, 0, True, "gptq", 2**70)), label=label)


def spoil(folder: Path, data: st.DataObject) -> tuple[str, bool]:
    """Spoil the copy at ``folder``; (what was done, whether it must load unchanged)."""
    kind = data.draw(st.sampled_from((
        "truncated shard", "empty shard", "garbage shard", "config type", "config non-UTF-8", "config nested",
        "config FIFO", "config folder", "quantization field", "index type", "index values", "index escape",
        "index missing file", "tensor dtype", "tensor emptied", "tensor flattened", "tensor missing",
        "tensor in two shards", "HF cache symlinks", "unknown config key",
    )), label="spoil")
    config, index = folder / "config.json", folder / INDEX
    if kind == "truncated shard":
        shard = data.draw(st.sampled_from(_shards(folder)), label="shard")
        size = shard.stat().st_size
        cut = data.draw(st.integers(0, size - 1), label="cut")
        with open(shard, "r+b") as f:
            f.truncate(cut)
        return f"{shard.name} cut at {cut} of {size}", False
    if kind == "empty shard":
        data.draw(st.sampled_from(_shards(folder)), label="shard").write_bytes(b"")
        return kind, False
    if kind == "garbage shard":
        shard = data.draw(st.sampled_from(_shards(folder)), label="shard")
        head = data.draw(st.sampled_from((b"\xff" * 8, (2**40).to_bytes(8, "little"), (16).to_bytes(8, "little"))))
        shard.write_bytes(head + b'{"x": garbage' + bytes(64))
        return f"{shard.name} garbage", False
    if kind == "config type":
        config.write_text(json.dumps(_json_value(data, "config")))
        return kind, False
    if kind == "config non-UTF-8":
        config.write_bytes(b'{"quantization_config": "\xff\xfe"}')
        return kind, False
    if kind == "config nested":
        config.write_text("[" * 50_000 + "]" * 50_000)
        return kind, False
    if kind == "config FIFO":
        config.unlink()
        os.mkfifo(config)
        return kind, False
    if kind == "config folder":
        config.unlink()
        config.mkdir()
        return kind, False
    if kind in ("quantization field", "unknown config key"):
        data_ = json.loads(config.read_text())
        q = data_["quantization_config"]
        if kind == "unknown config key":
            q["quantcore_fuzz_extra"] = 1
        else:
            field = data.draw(st.sampled_from(("bits", "group_size", "sym", "desc_act", "quant_method",
                                               "checkpoint_format", "pack_dtype", "static_groups", "meta")))
            q[field] = _json_value(data, "value")
        config.write_text(json.dumps(data_))
        return kind if kind == "unknown config key" else f"{kind} {field}={q[field]!r}", kind == "unknown config key"
    if kind.startswith("index"):
        data_ = json.loads(index.read_text())
        if kind == "index type":
            data_ = data.draw(st.sampled_from((None, [], {"weight_map": []}, {"weight_map": None}, {})))
        else:
            wm = data_["weight_map"]
            key = data.draw(st.sampled_from(sorted(wm)), label="entry")
            if kind == "index values":
                wm[key] = _json_value(data, "file")
            elif kind == "index missing file":
                wm[key] = "model-00009-of-00009.safetensors"
            else:
                outside = folder.parent / f"outside-{folder.name}.safetensors"
                shutil.copy(folder / wm[key], outside)
                target = data.draw(st.sampled_from((f"../{outside.name}", str(outside), "sub/../../" + outside.name)))
                for k, v in list(wm.items()):
                    if v == wm[key] and k != key:
                        wm[k] = target
                wm[key] = target
        index.write_text(json.dumps(data_))
        return f"{kind}", False
    if kind.startswith("tensor") and kind != "tensor in two shards":
        return _edit_tensors(folder, data, kind.split(" ", 1)[1]), False
    if kind == "tensor in two shards":
        from safetensors.torch import load_file, save_file

        first, second = _shards(folder)[:2]
        a, b = load_file(str(first)), load_file(str(second))
        name = sorted(a)[0]
        b[name] = a[name]
        save_file(b, str(second))
        return f"{name} in {first.name} and {second.name}", False
    # The Hugging Face cache: a snapshot folder of symlinks into ../../blobs.
    blobs = folder.parent / "blobs"
    blobs.mkdir(exist_ok=True)
    for path in sorted(folder.iterdir()):
        blob = blobs / f"{folder.name}-{path.name}"
        shutil.move(str(path), blob)
        path.symlink_to(os.path.relpath(blob, folder))
    return kind, True


# --- judging ----------------------------------------------------------------------------------


def _layers_match_their_tensors(model: nn.Module, folder: Path) -> str | None:
    """Every quantized layer computes what the eager reader says its tensors define."""
    try:
        read = load_checkpoint(folder)
    except QuantCoreError as exc:
        return f"loaded, but the eager reader refuses the same folder: {exc}"
    gen = torch.Generator().manual_seed(3)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    if set(layers) != set(read.linears):
        return f"quantized layers {sorted(layers)} != the checkpoint's {sorted(read.linears)}"
    for name, layer in layers.items():
        x = torch.randn(2, layer.in_features, generator=gen)
        ref = x.double() @ read.format_of(name).dequantize(read.linears[name]).T
        if "bias" in read.linears[name]:
            ref = ref + read.linears[name]["bias"].double()
        y = layer(x.to(layer.dtype)).double()
        rel = ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        if rel > 2e-2:
            return f"{name}: rel error {rel:.2e} against its tensors"
    return None


@settings(max_examples=examples("io"))
@given(data=st.data())
def test_spoiled_checkpoint_folders(pristine: Path, data: st.DataObject, tmp_path_factory: Any) -> None:
    folder = tmp_path_factory.mktemp("spoiled") / "model"
    shutil.copytree(pristine, folder)
    what, unchanged = spoil(folder, data)
    door = data.draw(st.sampled_from(("load_checkpoint", "load_quantized into a skeleton", "load_quantized a folder")))
    names = (str(folder), folder.name, "config.json", INDEX, "checkpoint_dir", "shard")

    def load() -> Any:
        if door == "load_checkpoint":
            return load_checkpoint(folder)
        if door == "load_quantized into a skeleton":
            return quantcore.load_quantized(skeleton(_config()), folder, dtype=torch.float32)
        return quantcore.load_quantized(folder, dtype=torch.float32)

    def judge(result: Any) -> str | None:
        if door == "load_checkpoint":
            return None if result.linears else "no linears read"
        return _layers_match_their_tensors(result, folder)

    outcome, _ = attempt(f"checkpoint:{door}", load, names=names, judge=judge, timeout=TIMEOUT_S,
                         context=lambda: f"{door}: {what}")
    assert outcome == "handled" or not unchanged, f"{door} refused a folder that only {what}"


# --- TurboQuant's single file ------------------------------------------------------------------


@pytest.fixture(scope="module")
def turboquant_file(tmp_path_factory: Any) -> Path:
    from quantcore.nn.turboquant.model import TurboQuantConfig, quantize_model, save_quantized

    model = quantize_model(nn.Sequential(nn.Linear(64, 32)), TurboQuantConfig(bits=4, group_size=32, skip=()))
    path = tmp_path_factory.mktemp("turboquant") / "model.safetensors"
    save_quantized(model, path)
    return path


@settings(max_examples=examples("io"))
@given(data=st.data())
def test_spoiled_turboquant_files(turboquant_file: Path, data: st.DataObject, tmp_path_factory: Any) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    from quantcore.nn.turboquant.model import METADATA_KEY, load_quantized

    path = tmp_path_factory.mktemp("tq") / "model.safetensors"
    with safe_open(str(turboquant_file), framework="pt") as f:
        meta = json.loads(f.metadata()[METADATA_KEY])
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    where = data.draw(st.sampled_from(("metadata", "field", "module", "tensor", "file", "nothing")), label="spoil")
    raw: Any = json.dumps(meta)
    if where == "metadata":
        raw = data.draw(st.sampled_from(("{", "[]", "null", '"x"', json.dumps({"format": "turboquant"}))))
    elif where == "field":
        key = data.draw(st.sampled_from(sorted(meta["config"])), label="key")
        meta["config"][key] = _json_value(data, "value")
        raw = json.dumps(meta)
    elif where == "module":
        spec = copy.deepcopy(meta["modules"]["0"])
        spec[data.draw(st.sampled_from(sorted(spec)), label="key")] = _json_value(data, "value")
        meta["modules"] = data.draw(st.sampled_from(({"0": spec}, [], {"nope": spec}, {"0": 5})))
        raw = json.dumps(meta)
    elif where == "tensor":
        name = data.draw(st.sampled_from(sorted(tensors)), label="tensor")
        tensors[name] = tensors[name].reshape(-1)[:-1].contiguous()
    save_file(tensors, str(path), metadata={METADATA_KEY: raw})
    if where == "file":
        path.write_bytes(path.read_bytes()[: data.draw(st.integers(0, 200), label="cut")])

    def load() -> Any:
        return load_quantized(nn.Sequential(nn.Linear(64, 32, device="meta")), path)

    def judge(model: Any) -> str | None:
        x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
        y = model(x)
        return None if y.shape == (3, 32) and bool(torch.isfinite(y).all()) else f"returned {y!r:.80}"

    outcome, _ = attempt("checkpoint:turboquant file", load, names=(str(path), path.name), judge=judge,
                         timeout=TIMEOUT_S, context=f"{where} spoiled")
    assert outcome == "handled" or where != "nothing"



# --- quantization configs ------------------------------------------------------------------------

CONFIGS = {
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": False,
             "static_groups": False, "checkpoint_format": "gptq", "pack_dtype": "int32",
             "meta": {"quantizer": ["gptqmodel:2.0"]}},
    "awq": {"w_bit": 4, "q_group_size": 128, "zero_point": True, "version": "gemm"},
    "compressed-tensors": {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "ignore": ["lm_head", "re:.*gate$"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 128,
            "actorder": None, "dynamic": False}}},
    },
    "quantcore": {"quant_method": "quantcore", "checkpoint": {"quant_method": "gptq", "bits": 8, "group_size": -1}},
}


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path] if path else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*path, i))
    return out


@settings(max_examples=examples("fast"))
@given(data=st.data())
def test_malformed_quantization_configs(data: st.DataObject) -> None:
    from quantcore.checkpoint.config import format_from_config, scheme_from_config

    kind = data.draw(st.sampled_from(sorted(CONFIGS)), label="config")
    cfg = copy.deepcopy(CONFIGS[kind])
    edits = []
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        path = data.draw(st.sampled_from(_paths(cfg) or [("x",)]), label="where")
        node = cfg
        try:
            for key in path[:-1]:
                node = node[key]
            if data.draw(st.booleans(), label="delete") and isinstance(node, dict):
                node.pop(path[-1], None)
                edits.append(f"del {list(path)}")
            else:
                node[path[-1]] = _json_value(data, "value")
                edits.append(f"{list(path)} = {node[path[-1]]!r}")
        except (KeyError, IndexError, TypeError):  # an earlier edit replaced a parent
            continue
    source = "config.json"
    door = data.draw(st.sampled_from(("scheme", "format")), label="door")

    def read() -> Any:
        return (scheme_from_config if door == "scheme" else format_from_config)(cfg, source)

    attempt(f"checkpoint:config {door}", read, names=(source,), context=lambda: f"{kind}: {'; '.join(edits)}")
