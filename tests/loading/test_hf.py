"""Hugging Face ``from_pretrained`` / ``save_pretrained`` through quantcore, on tiny Llamas
built from their config (CPU): GPTQ (v2 and act-order v1) and AWQ checkpoints written in
the tools' layout, compressed-tensors written by its own package. Each loads through
``from_pretrained`` into the same modules and the same logits as ``load_quantized``, each
layer within the kernel tolerance of the writer's dequantization; ``save_pretrained``
writes a checkpoint both entry points read back to the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import quantcore
from quantcore.checkpoint import load_checkpoint, quantize_linears, save_checkpoint
from quantcore.checkpoint.load import load_quantized
from quantcore.errors import InvalidArgumentError, TensorFormatError
from quantcore.formats.awq import AWQ
from quantcore.formats.gptq import GPTQ
from quantcore.nn.incoming import SOURCE
from quantcore.nn.linear import QuantLinear
from quantcore.ops.linear import linear_reference
from quantcore.ops.tolerance import judge_output

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

IDS = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(0))


def tiny_llama(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model


def write_tool_checkpoint(folder: Path, fmt, *, meta: object = "keep", zeros_of_0: bool = False,
                          shards: int = 1) -> dict[str, dict[str, torch.Tensor]]:
    """A GPTQ or AWQ checkpoint of a tiny Llama (lm_head left dense, as the tools do);
    ``zeros_of_0``: each linear's first group all positive, so its zero points are 0."""
    model = tiny_llama()
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]
    if zeros_of_0:
        with torch.no_grad():
            for name in names:
                model.get_submodule(name).weight[:, :32] = model.get_submodule(name).weight[:, :32].abs() + 0.01
    kwargs = {"generator": torch.Generator().manual_seed(1)} if isinstance(fmt, GPTQ) else {}
    linears = quantize_linears(model, fmt, names, **kwargs)
    others = {k: v for k, v in model.state_dict().items() if not any(k.startswith(f"{n}.") for n in names)}
    save_checkpoint(folder, fmt, linears, others, base_config=model.config.to_dict(), shards=shards)
    if meta != "keep":
        cfg = json.loads((folder / "config.json").read_text())
        cfg["quantization_config"]["meta"] = meta
        (folder / "config.json").write_text(json.dumps(cfg))
    return linears


def _writer_weights(folder: Path) -> dict[str, torch.Tensor]:
    ckpt = load_checkpoint(folder)
    return {name: ckpt.format_of(name).dequantize(t) for name, t in ckpt.linears.items()}


def _from_pretrained(folder: Path, **options) -> nn.Module:
    import quantcore.hf

    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, config=quantcore.hf.config_for(folder, **options), dtype=torch.bfloat16)


def _logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def _check_layers(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    modules = dict(model.named_modules())
    assert type(modules["lm_head"]) is nn.Linear
    gen = torch.Generator().manual_seed(2)
    for name, weight in weights.items():
        layer = modules[name]
        assert isinstance(layer, QuantLinear), name
        x = torch.randn(3, layer.in_features, generator=gen).to(torch.bfloat16)
        verdict = judge_output(layer(x), linear_reference(x, weight), torch.bfloat16)
        assert verdict.ok, f"{name} ({layer.kernel.name}): {verdict.problem}"


def _gptq(folder: Path) -> None:
    write_tool_checkpoint(folder, GPTQ(bits=4, group_size=32, sym=False))


def _gptq_v1_act(folder: Path) -> None:
    write_tool_checkpoint(folder, GPTQ(bits=4, group_size=32, sym=False, desc_act=True, checkpoint_format="v1"),
                          meta={"quantizer": ["gptqmodel:2.2.0"]})


def _gptq_sharded(folder: Path) -> None:
    write_tool_checkpoint(folder, GPTQ(bits=4, group_size=32, sym=True), shards=3)


def _gptq8(folder: Path) -> None:
    write_tool_checkpoint(folder, GPTQ(bits=8, group_size=64, sym=True))


def _awq(folder: Path) -> None:
    write_tool_checkpoint(folder, AWQ(group_size=32))


def _compressed(folder: Path) -> None:
    pytest.importorskip("compressed_tensors", reason="pip install compressed-tensors (writes the checkpoint)")
    from tests.compressed_tensors.writer import scheme, write_checkpoint

    write_checkpoint(folder, tiny_llama(), {"attn": scheme(8, None, targets=[r"re:.*self_attn\."]),
                                            "mlp": scheme(4, 32, sym=False, actorder=True, targets=[r"re:.*mlp\."])},
                     ignore=["lm_head"])


WRITERS = {"gptq4-asym": _gptq, "gptq4-sharded": _gptq_sharded, "gptq4-act-v1": _gptq_v1_act, "gptq8": _gptq8, "awq": _awq,
           "compressed-tensors": _compressed}


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_from_pretrained_loads_like_load_quantized_and_saves_a_checkpoint_both_read(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    WRITERS[kind](folder)
    direct = load_quantized(folder)
    via_hf = _from_pretrained(folder)
    _check_layers(via_hf, _writer_weights(folder))
    want = _logits(direct)
    assert torch.equal(_logits(via_hf), want)
    assert via_hf.config.quantization_config.quant_method == "quantcore"

    saved = tmp_path / "saved"
    via_hf.save_pretrained(saved)
    assert json.loads((saved / "config.json").read_text())["quantization_config"]["quant_method"] == "quantcore"
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved, dtype=torch.bfloat16)
    assert torch.equal(_logits(reloaded), want)
    assert torch.equal(_logits(load_quantized(saved)), want)
    assert sorted(load_checkpoint(saved).linears) == sorted(load_checkpoint(folder).linears)


def test_quantize_while_loading_then_save(tmp_path: Path) -> None:
    import quantcore.hf

    dense = tiny_llama()
    dense.save_pretrained(tmp_path / "dense")
    config = quantcore.hf.QuantCoreConfig(quantize={"name": "gptq", "bits": 4, "group_size": 32})
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense", quantization_config=config,
                                                              dtype=torch.bfloat16)
    modules = dict(model.named_modules())
    assert isinstance(modules["model.layers.0.mlp.up_proj"], QuantLinear) and type(modules["lm_head"]) is nn.Linear
    want = _logits(model)
    assert not torch.equal(want, _logits(dense))  # quantized: the weights changed
    model.save_pretrained(tmp_path / "saved")
    assert torch.equal(_logits(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved",
                                                                                  dtype=torch.bfloat16)), want)
    assert torch.equal(_logits(load_quantized(tmp_path / "saved")), want)


def test_a_format_no_checkpoint_is_written_in_loads_and_runs_but_refuses_to_save(tmp_path: Path) -> None:
    """TurboQuant while loading: the model runs quantized; save_pretrained says why it
    cannot write it, before writing anything (it used to fail after quantizing, with a
    TypeError from the config writer)."""
    import quantcore.hf
    from quantcore.nn.turboquant import TurboQuantLinear

    dense = tiny_llama()
    dense.save_pretrained(tmp_path / "dense")
    config = quantcore.hf.QuantCoreConfig(quantize={"name": "turboquant", "bits": 4, "group_size": 32})
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dense", quantization_config=config,
                                                              dtype=torch.bfloat16)
    up = dict(model.named_modules())["model.layers.0.mlp.up_proj"]
    assert isinstance(up, TurboQuantLinear)
    assert not any(n.startswith(SOURCE) for n, _ in up.named_buffers())  # nothing kept for a save that cannot be
    logits = _logits(model)
    assert torch.isfinite(logits).all() and not torch.equal(logits, _logits(dense))
    with pytest.raises(InvalidArgumentError, match=r"save_pretrained: .*not tq4-g32"):
        model.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved" / "model.safetensors").exists()


def test_the_checkpoint_writer_refuses_a_format_it_cannot_describe_naming_it(tmp_path: Path) -> None:
    from quantcore.formats.turboquant import TurboQuant

    fmt = TurboQuant(bits=4, group_size=32)
    with pytest.raises(InvalidArgumentError, match=r"fmt: quantcore writes gptq and awq checkpoints, not tq4-g32"):
        save_checkpoint(tmp_path, fmt, {})
    assert not any(tmp_path.iterdir())


def test_an_unnamed_v1_producer_is_refused_through_from_pretrained_too(tmp_path: Path) -> None:
    fmt = GPTQ(bits=4, group_size=32, sym=False, checkpoint_format="v1")
    linears = write_tool_checkpoint(tmp_path, fmt, meta=None, zeros_of_0=True)
    assert all((fmt.unpack_zeros(t)[0] == 0).all() for t in linears.values())
    with pytest.raises(TensorFormatError, match="v1_zeros='lanes'"):
        _from_pretrained(tmp_path)
    assert torch.equal(_logits(_from_pretrained(tmp_path, v1_zeros="fields")),
                       _logits(load_quantized(tmp_path, v1_zeros="fields")))


def test_import_quantcore_does_not_import_transformers() -> None:
    import subprocess
    import sys

    code = "import sys, quantcore; quantcore.QuantLinear; print('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert quantcore.hf.QuantCoreConfig().to_dict()["quant_method"] == "quantcore"


def test_a_quantized_checkpoint_whose_quantcore_config_holds_no_checkpoint_is_refused(tmp_path: Path) -> None:
    import quantcore.hf  # registers quant_method quantcore with transformers

    _gptq(tmp_path)
    config = quantcore.hf.config_for(tmp_path)
    config.quantization_config = {"quant_method": "quantcore"}
    with pytest.raises(InvalidArgumentError, match="quantization config holds no 'checkpoint'"):
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path, config=config, dtype=torch.bfloat16)
