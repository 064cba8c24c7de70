"""``quantcore.load_quantized`` and ``quantcore.quantize_``: a Llama-architecture model
(transformers) quantized, written as a sharded checkpoint in the real layout, loaded in
one call, lazily; and every malformed checkpoint refused with the file, the layer and
the tensor named, the model left as it was."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import quantcore
from quantcore.checkpoint import load_checkpoint, replace_linears
from quantcore.errors import InvalidArgumentError, QuantCoreWarning, TensorFormatError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.formats.turboquant import TurboQuant
from quantcore.nn.linear import QuantLinear
from quantcore.nn.turboquant import TurboQuantLinear
from tests.llama_checkpoint import llama, skeleton, write_quantized

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

FMT = GPTQ(bits=4, group_size=32, sym=False)


def _config() -> object:
    return transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )


def _model(seed: int = 0) -> nn.Module:
    return llama(_config(), seed)


def _write(folder: Path, model: nn.Module, fmt=FMT, shards: int = 3) -> dict[str, dict[str, torch.Tensor]]:
    return write_quantized(folder, model, fmt, _config(), shards)


def _skeleton() -> nn.Module:
    return skeleton(_config())


def _reference(model: nn.Module, folder: Path) -> nn.Module:
    """The same checkpoint through the eager reader and replace_linears."""
    ref = copy.deepcopy(model)
    replace_linears(ref, load_checkpoint(folder), dtype=torch.float32)
    return ref


def test_loads_a_sharded_checkpoint_from_its_folder_lazily(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    _write(tmp_path, model)
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ref = _reference(model, tmp_path)
    import safetensors.torch

    def eager(*_: object, **__: object) -> None:
        raise AssertionError("load_quantized read a whole shard")

    monkeypatch.setattr(safetensors.torch, "load_file", eager)
    loaded = quantcore.load_quantized(tmp_path, dtype=torch.float32)  # built from config.json, params on meta
    assert sum(isinstance(m, QuantLinear) for m in loaded.modules()) == 14  # 2 layers × 7 projections
    assert type(loaded.lm_head) is nn.Linear
    assert not [n for n, p in loaded.named_parameters() if p.device.type == "meta"]
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, ref(ids).logits)
    # A skeleton given by the caller, on meta.
    into = quantcore.load_quantized(_skeleton(), tmp_path, dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(into(ids).logits, ref(ids).logits)


def _shard_with(folder: Path, name: str) -> Path:
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    return folder / index[name]


def _rewrite(path: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


LAYER = "model.layers.1.mlp.down_proj"


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing_shard", r"index\.json: names shard model-00002-of-00003\.safetensors, which is not in"),
        ("moved_tensor", r"index\.json: maps model\.layers\.1\.mlp\.down_proj\.scales to model-0000\d-of-00003\.safetensors, but no shard holds it"),
        ("unlisted_tensor", r"model-0000\d-of-00003\.safetensors: holds extra\.tensor, which model\.safetensors\.index\.json does not list"),
        ("missing_qzeros", r"model-0000\d-of-00003\.safetensors: model\.layers\.1\.mlp\.down_proj: .*qzeros"),
        ("wrong_dtype", r"model-0000\d-of-00003\.safetensors: model\.layers\.1\.mlp\.down_proj: .*scales.*int32"),
        ("wrong_shape", r"model-0000\d-of-00003\.safetensors: model\.layers\.1\.mlp\.down_proj: .*(qweight|g_idx)"),
        ("dense_shape", r"model\.norm\.weight: expected shape \(64,\) \(the model's\), got \(32,\)"),
        ("missing_dense", r"no tensor for the model's model\.norm\.weight"),
    ],
)
def test_a_bad_checkpoint_names_file_layer_and_tensor_and_leaves_the_model_alone(
    tmp_path: Path, case: str, message: str
) -> None:
    model = _model()
    _write(tmp_path, model)
    if case == "missing_shard":
        (tmp_path / "model-00002-of-00003.safetensors").unlink()
    elif case == "moved_tensor":
        _rewrite(_shard_with(tmp_path, f"{LAYER}.scales"), lambda t: t.pop(f"{LAYER}.scales"))
    elif case == "unlisted_tensor":
        _rewrite(_shard_with(tmp_path, "model.norm.weight"), lambda t: t.update({"extra.tensor": torch.ones(2)}))
    elif case in ("missing_qzeros", "wrong_dtype", "wrong_shape", "dense_shape", "missing_dense"):
        key = {"missing_qzeros": "qzeros", "wrong_dtype": "scales", "wrong_shape": "qweight"}.get(case)
        name = f"{LAYER}.{key}" if key else "model.norm.weight"

        def change(t: dict[str, torch.Tensor]) -> None:
            if case in ("missing_qzeros", "missing_dense"):
                t.pop(name)
            elif case == "wrong_dtype":
                t[name] = t[name].to(torch.int32)
            elif case == "wrong_shape":
                t[name] = t[name][:-1].contiguous()
            else:
                t[name] = t[name][:32].contiguous()

        shard = _shard_with(tmp_path, name)
        _rewrite(shard, change)
        if case in ("missing_qzeros", "missing_dense"):  # keep the index consistent: the tensor is just gone
            index_path = tmp_path / "model.safetensors.index.json"
            index = json.loads(index_path.read_text())
            index["weight_map"].pop(name)
            index_path.write_text(json.dumps(index))
    skeleton = _skeleton()
    before = {n: type(m) for n, m in skeleton.named_modules()}
    with pytest.raises(TensorFormatError, match=message):
        quantcore.load_quantized(skeleton, tmp_path)
    assert {n: type(m) for n, m in skeleton.named_modules()} == before
    assert all(p.device.type == "meta" for p in skeleton.parameters())


def test_quantize_replaces_linears_and_warns_once_for_those_left_dense() -> None:
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 100), nn.Linear(100, 64))
    x = torch.randn(3, 256)
    with torch.no_grad():
        ref = model(x)
    # GPTQ and AWQ pack 8 outputs per lane (N=100 cannot); TurboQuant needs K % 64 == 0.
    for fmt, module, dense in ((GPTQ(group_size=32), QuantLinear, ["2", "3"]),
                               (AWQ(group_size=32), QuantLinear, ["2", "3"]),
                               (TurboQuant(group_size=64), TurboQuantLinear, ["3"])):
        q = copy.deepcopy(model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quantcore.quantize_(q, fmt)
        mine = [w for w in caught if issubclass(w.category, QuantCoreWarning)]
        assert len(mine) == 1 and f"{len(dense)} of 3 linear layers left dense" in str(mine[0].message)
        assert all(f"{n} (" in str(mine[0].message) for n in dense)
        assert isinstance(q[0], module)
        assert [i for i in ("2", "3") if type(q[int(i)]) is nn.Linear] == dense
        with torch.no_grad():
            err = ((q(x) - ref).norm() / ref.norm()).item()
        assert 0 < err < 0.15, (fmt.slug, err)
    only_first = copy.deepcopy(model)
    quantcore.quantize_(only_first, GPTQ(group_size=32), filter_fn=lambda m, name: name == "0")
    assert isinstance(only_first[0], QuantLinear)
    with pytest.raises(InvalidArgumentError, match="is a moe format"):
        quantcore.quantize_(copy.deepcopy(model), TRTLLMMoE())
