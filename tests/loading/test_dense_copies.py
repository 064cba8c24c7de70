"""A quantized layer that holds its weight dense says so: one QuantCoreWarning per model,
naming the layers and the bytes, from ``quantize_`` and from ``load_quantized`` alike
(GPTQ 8-bit has no CPU kernel that keeps it compressed; 4-bit g32 has aten_cpu)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import quantcore
from quantcore.checkpoint import quantize_linears, save_checkpoint
from quantcore.errors import QuantCoreWarning
from quantcore.formats.gptq import GPTQ

pytest.importorskip("safetensors")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).to(torch.bfloat16)


def _caught(run) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if issubclass(w.category, QuantCoreWarning) and "dense copy" in str(w.message)]


def _held(model: nn.Module, name: str) -> int:
    return sum(t.nbytes for t in model.get_submodule(name).state_tensors())


def test_quantize_warns_once_naming_layers_and_bytes() -> None:
    model = _model()
    messages = _caught(lambda: quantcore.quantize_(model, GPTQ(bits=8, group_size=128)))
    assert len(messages) == 1
    message = messages[0]
    assert "2 of 2 quantized layers" in message and "torch_fallback" in message
    for name in ("0", "2"):
        assert f"{name} ({_held(model, name):,} bytes)" in message
    total = _held(model, "0") + _held(model, "2")
    assert f"{total:,} bytes in all" in message
    # The dense copy really is as large as the dense layer (bf16: 2 bytes a weight), or larger.
    assert _held(model, "0") >= 256 * 512 * 2
    assert not _caught(lambda: quantcore.quantize_(_model(), GPTQ(bits=4, group_size=32)))


def test_load_quantized_warns_once(tmp_path: Path) -> None:
    fmt = GPTQ(bits=8, group_size=128)
    model = _model()
    save_checkpoint(tmp_path, fmt, quantize_linears(model, fmt, ["0"]),
                    {k: v for k, v in model.state_dict().items() if not k.startswith("0.")})
    messages = _caught(lambda: quantcore.load_quantized(_model(), tmp_path))
    assert len(messages) == 1 and re.search(r"1 of 1 quantized layers .* 0 \([\d,]+ bytes\)", messages[0])
    assert str(tmp_path) in messages[0]
