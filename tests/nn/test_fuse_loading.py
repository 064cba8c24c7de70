"""``load_quantized(..., fuse=True)``: a Llama checkpoint written in the real sharded
layout, read with q/k/v and gate/up concatenated before anything is prepared. The fused
model gives the unfused load's logits bit for bit; an act-order checkpoint whose layers
were quantized with different column orders loads unfused, with one warning naming the
groups; a bad tensor is still reported with its file, layer and tensor."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import quantcore
from quantcore.checkpoint import quantize_linears, save_checkpoint
from quantcore.errors import QuantCoreWarning, TensorFormatError
from quantcore.formats.gptq import GPTQ
from quantcore.nn.fuse import FusedSlice
from quantcore.nn.linear import QuantLinear

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")


def _config() -> object:
    return transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )


def _write(folder: Path, fmt, *, shared_draw: bool) -> None:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config()).eval()
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]
    linears = {}
    for name in names:  # one draw per layer (act-order's column order), the same one with shared_draw
        seed = int(name.split(".")[2]) if shared_draw else len(linears)
        linears.update(quantize_linears(model, fmt, [name], generator=torch.Generator().manual_seed(seed)))
    covered = {f"{n}.{leaf}" for n in names for leaf in ("weight", "bias")}
    others = {k: v for k, v in model.state_dict().items() if k not in covered}
    save_checkpoint(folder, fmt, linears, others, base_config=_config().to_dict(), shards=3)


def _logits(model: nn.Module) -> torch.Tensor:
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("fmt", [GPTQ(bits=4, group_size=32, sym=False),
                                 GPTQ(bits=4, group_size=32, sym=False, desc_act=True, checkpoint_format="v1")],
                         ids=lambda f: f.slug)
def test_a_fused_load_gives_the_unfused_loads_logits(tmp_path: Path, fmt) -> None:
    _write(tmp_path, fmt, shared_draw=True)
    unfused = quantcore.load_quantized(tmp_path, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", QuantCoreWarning)
        fused = quantcore.load_quantized(tmp_path, dtype=torch.float32, fuse=True)
    assert sum(isinstance(m, QuantLinear) for m in unfused.modules()) == 14
    assert sum(isinstance(m, QuantLinear) for m in fused.modules()) == 8
    assert sum(isinstance(m, FusedSlice) for m in fused.modules()) == 10
    assert torch.equal(_logits(fused), _logits(unfused))


def test_layers_quantized_apart_load_unfused_with_one_warning(tmp_path: Path) -> None:
    fmt = GPTQ(bits=4, group_size=32, sym=False, desc_act=True)
    _write(tmp_path, fmt, shared_draw=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = quantcore.load_quantized(tmp_path, dtype=torch.float32, fuse=True)
    (warning,) = [w for w in caught if issubclass(w.category, QuantCoreWarning)]
    text = str(warning.message)
    assert "load_quantized: 4 of 4 groups of projections left unfused" in text
    assert "model.layers.0.self_attn: q_proj, k_proj, v_proj (FusionError: " in text and "g_idx" in text
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 14
    assert torch.equal(_logits(model), _logits(quantcore.load_quantized(tmp_path, dtype=torch.float32)))


def test_a_bad_tensor_in_a_fused_group_names_its_file_layer_and_tensor(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    _write(tmp_path, GPTQ(bits=4, group_size=32, sym=False), shared_draw=True)
    name = "model.layers.1.self_attn.k_proj.scales"
    shard = tmp_path / json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = load_file(str(shard))
    tensors[name] = tensors[name].to(torch.int32)
    save_file(tensors, str(shard))
    with pytest.raises(TensorFormatError, match=r"model-0000\d-of-00003\.safetensors: model\.layers\.1\.self_attn\.k_proj: "
                                                r".*scales.*int32"):
        quantcore.load_quantized(tmp_path, dtype=torch.float32, fuse=True)


def test_a_turboquant_file_loads_with_fuse_and_says_which_groups_it_could_not_fuse(tmp_path: Path) -> None:
    """TurboQuant's single-file checkpoints draw each layer's rotation on its own, so
    their projections do not concatenate: the load warns once, naming the rotation, and
    the model runs unfused."""
    from quantcore.nn.turboquant.model import TurboQuantConfig, quantize_model, save_quantized

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config()).eval()
    skeleton = transformers.LlamaForCausalLM(_config()).eval()
    quantize_model(model, TurboQuantConfig(group_size=64))
    save_quantized(model, tmp_path / "model.safetensors")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = quantcore.load_quantized(skeleton, tmp_path / "model.safetensors", dtype=torch.float32, fuse=True)
    (warning,) = [w for w in caught if issubclass(w.category, QuantCoreWarning)]
    assert "fuse_projections: 4 of 4 groups of projections left unfused" in str(warning.message)
    assert "rotation is not cut along N" in str(warning.message)
    assert not any(isinstance(m, FusedSlice) for m in loaded.modules())
    assert torch.equal(_logits(loaded), _logits(model))
