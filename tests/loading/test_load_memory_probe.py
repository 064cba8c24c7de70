"""The load-memory probe (``tools/probes/load_memory.py``) at a tiny scale on the CPU:
its streamed checkpoint is what ``save_checkpoint`` writes and loads in every format (each
layer within tolerance of its format's dequantization), the writer holds one unit of
tensors at a time, and the probe runs end to end in a subprocess and reports what it
measured. A memory bound is not asserted: on a CPU the loaded model itself is host memory."""

from __future__ import annotations

import json
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

import quantcore
from quantcore.checkpoint import save_checkpoint
from quantcore.checkpoint.shards import INDEX
from quantcore.nn.linear import QuantLinear
from quantcore.ops.linear import linear_reference
from quantcore.ops.tolerance import judge_output
from tools.probes import load_memory_checkpoint as writer
from tools.probes.load_memory_checkpoint import FORMATS, LINEARS, Llama, write_checkpoint

transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

ROOT = Path(__file__).resolve().parents[2]
TINY = Llama(layers=2, hidden=256, intermediate=512, vocab=512)


def _read_all(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = folder / INDEX
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    out: dict[str, torch.Tensor] = {}
    for file in files:
        out.update(load_file(str(folder / file)))
    return out


@pytest.mark.parametrize("kind", ["gptq4", "awq4"])
def test_the_streamed_checkpoint_is_what_save_checkpoint_writes(tmp_path: Path, kind: str) -> None:
    written = write_checkpoint(tmp_path / "streamed", kind, TINY, seed=3, shard_bytes=300_000)
    assert len(written.files) > 2 and (tmp_path / "streamed" / INDEX).exists()
    tensors, gen = {}, torch.Generator().manual_seed(3)
    for unit in writer.units(FORMATS[kind], TINY):  # the same draws, in the same order
        tensors.update(unit.draw(gen))
    layers = [f"model.layers.{i}.{n}" for i in range(TINY.layers) for n in LINEARS]
    linears = {p: {k[len(p) + 1:]: t for k, t in tensors.items() if k.startswith(p + ".")} for p in layers}
    others = {k: t for k, t in tensors.items() if not any(k.startswith(p + ".") for p in layers)}
    save_checkpoint(tmp_path / "saved", FORMATS[kind], linears, others, base_config=TINY.config(), shards=2)

    assert json.loads((tmp_path / "streamed" / "config.json").read_text()) == \
        json.loads((tmp_path / "saved" / "config.json").read_text())
    streamed, saved = _read_all(tmp_path / "streamed"), _read_all(tmp_path / "saved")
    assert sorted(streamed) == sorted(saved)
    for name, t in saved.items():
        assert streamed[name].dtype == t.dtype and torch.equal(streamed[name], t), name
    index = json.loads((tmp_path / "streamed" / INDEX).read_text())["weight_map"]
    assert set(index) == set(saved) and set(index.values()) == set(written.files)
    layer0 = sum(t.nbytes for k, t in saved.items() if k.startswith("model.layers.0.") and "layernorm" not in k)
    assert written.layer_bytes == layer0


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_every_format_loads_and_each_layer_computes_its_dequantization(tmp_path: Path, kind: str) -> None:
    write_checkpoint(tmp_path, kind, TINY, shard_bytes=400_000)
    model = quantcore.load_quantized(tmp_path, device="cpu")
    modules = dict(model.named_modules())
    fmt, stored = FORMATS[kind], _read_all(tmp_path)
    gen = torch.Generator().manual_seed(1)
    for name in (f"model.layers.{i}.{n}" for i in range(TINY.layers) for n in LINEARS):
        layer = modules[name]
        assert isinstance(layer, QuantLinear), name
        tensors = {k[len(name) + 1:]: t for k, t in stored.items() if k.startswith(name + ".")}
        x = torch.randn(3, layer.in_features, generator=gen).to(torch.bfloat16)
        verdict = judge_output(layer(x), linear_reference(x, fmt.dequantize(tensors)), torch.bfloat16)
        assert verdict.ok, f"{name} ({layer.kernel.name}): {verdict.problem}"
    logits = model(torch.randint(0, TINY.vocab, (1, 6), generator=gen)).logits
    assert logits.shape == (1, 6, TINY.vocab) and bool(torch.isfinite(logits).all())


def test_from_pretrained_reads_the_config_too(tmp_path: Path) -> None:
    import quantcore.hf

    write_checkpoint(tmp_path, "gptq4", TINY, shard_bytes=400_000)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, config=quantcore.hf.config_for(tmp_path),
                                                              dtype=torch.bfloat16)
    assert isinstance(model.get_submodule("model.layers.1.mlp.down_proj"), QuantLinear)


def test_the_writer_holds_one_unit_of_tensors_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    live: set[int] = set()
    peak = [0]
    original = writer.units

    def tracked(fmt, model):  # each unit's tensors tracked until freed
        def wrap(unit):
            def draw(gen):
                tensors = unit.draw(gen)
                for t in tensors.values():
                    live.add(id(t))
                    weakref.finalize(t, live.discard, id(t))
                peak[0] = max(peak[0], len(live))
                return tensors
            return writer.Unit(unit.name, unit.specs, draw)
        return [wrap(u) for u in original(fmt, model)]

    monkeypatch.setattr(writer, "units", tracked)
    write_checkpoint(tmp_path, "gptq4", Llama(layers=4, hidden=256, intermediate=512, vocab=512))
    per_layer = 2 + 4 * len(LINEARS)  # two norms, four tensors per GPTQ linear
    assert peak[0] == per_layer  # one layer's tensors, never two layers' ...
    assert not live  # ... and none left behind


def test_the_probe_runs_end_to_end_and_reports_what_it_measured(tmp_path: Path) -> None:
    out, kept = tmp_path / "out", tmp_path / "checkpoints"
    cmd = [sys.executable, "-m", "tools.probes.load_memory", "--out", str(out), "--device", "cpu",
           "--layers", "2", "--hidden", "256", "--intermediate", "512", "--vocab", "512", "--shard-gb", "0.0005",
           "--checkpoint", str(kept), "--keep"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads((out / "load_memory-cpu.json").read_text())

    stored = _read_all(kept / "gptq4-2L-256h")
    layer0 = sum(t.nbytes for k, t in stored.items() if k.startswith("model.layers.0.") and "layernorm" not in k)
    sizes = result["checkpoint"]
    assert sizes["layer_bytes"] == layer0 and len(sizes["files"]) > 1
    assert sizes["total_bytes"] == sum(t.nbytes for t in stored.values())
    assert sizes["dense_tensors"] == {"model.embed_tokens.weight": 512 * 256 * 2, "lm_head.weight": 512 * 256 * 2}
    assert sizes["largest_tensor"]["name"] == "model.embed_tokens.weight"

    measured = result["measured"]
    assert measured["layers"] == {"expected": 14, "quantized": 14, "types": {"QuantLinear": 14},
                                  "kernels": measured["layers"]["kernels"]}
    assert sum(measured["layers"]["kernels"].values()) == 14
    base, after = measured["steps"]["baseline"], measured["steps"]["after_load"]
    for key in ("VmRSS", "RssAnon", "RssFile"):
        assert measured["peaks"][key] >= base[key] > 0, key
    assert measured["vmhwm"] >= max(measured["peaks"]["VmRSS"], after["VmRSS"]) and measured["wall_s"] > 0
    assert measured["peak_reset_at_baseline"] and measured["ru_maxrss"] >= base["VmRSS"]
    assert set(measured["phases"]) == {"before_layers", "layers", "after_layers"}
    assert measured["phases"]["layers"]["peak_anon"] >= base["RssAnon"]
    assert measured["samples"] >= 2 and measured["timeline"]
    assert result["verdict"].startswith(("BELOW one layer", "ABOVE one layer"))
    assert result["judged"]["held_bytes"] == measured["peaks"]["RssAnon"] - base["RssAnon"]
    assert "loaded in" in run.stdout and result["verdict"] in run.stdout
