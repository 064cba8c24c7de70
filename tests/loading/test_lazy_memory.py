"""Loading is lazy: at no moment during ``load_quantized`` (or ``from_pretrained``) are the
checkpoint tensors of more than one quantized layer alive. Measured by tracking every
tensor the shard reader hands out until it is freed, at a small scale (eight layers, so an
eager loader would hold eight times the bound)."""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

import quantcore
from quantcore.checkpoint import load as load_module
from quantcore.checkpoint import quantize_linears, save_checkpoint
from quantcore.formats.gptq import GPTQ

pytest.importorskip("safetensors")

LAYERS, WIDTH = 8, 256


class Live:
    """Bytes of quantized-layer tensors read from the shards and not yet freed."""

    def __init__(self, layers: set[str]) -> None:
        self.layers, self.now, self.peak, self.read = layers, 0, 0, 0

    def track(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if name.rpartition(".")[0] in self.layers:
            self.now += t.nbytes
            self.read += t.nbytes
            self.peak = max(self.peak, self.now)
            weakref.finalize(t, self.free, t.nbytes)
        return t

    def free(self, nbytes: int) -> None:
        self.now -= nbytes


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))).to(torch.bfloat16)


def test_load_quantized_holds_one_layer_at_a_time(tmp_path: Path, monkeypatch) -> None:
    fmt = GPTQ(bits=4, group_size=32, sym=False)
    names = [str(i) for i in range(LAYERS)]
    linears = quantize_linears(_model(), fmt, names)
    save_checkpoint(tmp_path, fmt, linears, shards=3)
    per_layer = max(sum(t.nbytes for t in ts.values()) for ts in linears.values())
    live = Live(set(names))
    original = load_module._Shards.get
    monkeypatch.setattr(load_module._Shards, "get", lambda self, name: live.track(name, original(self, name)))
    model = quantcore.load_quantized(_model(), tmp_path)
    assert all(type(model.get_submodule(n)).__name__ == "QuantLinear" for n in names)
    assert live.read >= LAYERS * per_layer * 0.99  # every layer was read ...
    assert 0 < live.peak <= per_layer  # ... and never more than one layer's tensors at once
