"""An MLP block as one quantized checkpoint, and its float64 golden output: what the
tensor-parallel tests build column- and row-parallel pairs from."""

from __future__ import annotations

from pathlib import Path

import torch

from quantcore.checkpoint import save_checkpoint
from quantcore.formats.base import Format

ROUND = {"bfloat16": torch.bfloat16}


def mlp_layers(fmt: Format, hidden: int, inter: int, seed: int = 0) -> dict[str, dict[str, torch.Tensor]]:
    """gate/up ``[inter, hidden]`` and down ``[hidden, inter]``, random, through the golden
    quantizer; up and down carry a bias (down's is added once, on rank 0)."""
    gen = torch.Generator().manual_seed(seed)
    layers = {}
    for name, (n, k) in {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}.items():
        tensors = dict(fmt.quantize(torch.randn(n, k, generator=gen) * 0.05, generator=gen))
        if name != "gate_proj":
            tensors["bias"] = (torch.randn(n, generator=gen) * 0.1).to(torch.float16)
        layers[f"mlp.{name}"] = tensors
    return layers


def write_mlp(folder: Path, fmt: Format, hidden: int, inter: int, seed: int = 0) -> Path:
    return save_checkpoint(folder, fmt, mlp_layers(fmt, hidden, inter, seed))


def golden_mlp(fmt: Format, layers: dict[str, dict[str, torch.Tensor]], x: torch.Tensor) -> torch.Tensor:
    """``down(silu(gate(x)) · up(x))`` in float64, with every intermediate rounded to x's
    dtype where the kernels round it (each linear's output, the SiLU, the product)."""
    def linear(name: str, v: torch.Tensor) -> torch.Tensor:
        t = layers[f"mlp.{name}"]
        y = v.double() @ fmt.dequantize(t, dtype=torch.float64).T
        return y + t["bias"].double() if "bias" in t else y

    r = x.dtype
    gate = linear("gate_proj", x).to(r)
    up = linear("up_proj", x).to(r)
    h = (torch.nn.functional.silu(gate.float()).to(r) * up).to(r)
    return linear("down_proj", h)
