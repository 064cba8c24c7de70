"""Launching the gated activation (:mod:`.triton_source`) for the price of a launch.

A :class:`Bucket` holds what depends only on (activation, I, dtype, device): the block of
columns a program takes, the grid's second dim, the kernel bound to its launcher
(:class:`quantcore.triton.launch.Launch`, constexprs and options fixed). The row count only
sizes the grid. A call's host work: the bucket lookup, the output's ``torch.empty``, the
launch. Imports triton: loaded on the first call (:func:`.op.gated_activation`).
"""

from __future__ import annotations

import os

import torch
import triton

from ...triton.launch import Launch
from .triton_source import gated_activation_kernel

__all__ = ["MAX_BLOCK", "VARYING", "Bucket", "block_of", "run"]

#: The arguments that change between calls and that Triton specialises: h, out, h's row stride.
VARYING = (0, 1, 2)

#: Columns a program takes at most: 8 per thread with 4 warps, one 16-byte load of each
#: half per thread in bf16/fp16, two in fp32.
MAX_BLOCK = 1024


def block_of(inter: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for rows of ``inter`` outputs: the whole row up to
    :data:`MAX_BLOCK`, warps enough for 8 columns a thread."""
    block = max(16, min(MAX_BLOCK, triton.next_power_of_2(inter)))
    return block, max(1, min(4, block // 256))


class Bucket:
    """The kernel bound for one (activation, I, dtype, device)."""

    __slots__ = ("blocks", "device", "dtype", "inter", "launch")

    def __init__(self, activation: str, inter: int, dtype: torch.dtype, device: torch.device) -> None:
        block, warps = block_of(inter)
        self.inter, self.dtype, self.device = inter, dtype, device
        self.blocks = triton.cdiv(inter, block)
        compiled = device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"
        self.launch = Launch(gated_activation_kernel, device=device, varying=VARYING,
                             constexprs=dict(INTER=inter, ACT=activation, BLOCK=block, COMPILED=compiled),
                             options=dict(num_warps=warps, enable_fp_fusion=False))

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        rows = h if h.dim() == 2 else h.view(-1, h.shape[-1])
        # The sizes as arguments, not one tuple: torch parses them faster (docs/triton-launch.md).
        out = torch.empty(*h.shape[:-1], self.inter, dtype=self.dtype, device=self.device)
        m = rows.shape[0]
        if m and self.inter:
            self.launch((m, self.blocks, 1), rows, out, rows.stride(0))
        return out


_buckets: dict[tuple[str, int, torch.dtype, torch.device], Bucket] = {}


def run(h: torch.Tensor, activation: str) -> torch.Tensor:
    """The kernel's output for a checked ``h`` (:func:`.op.check_gated`) on its device."""
    inter = h.shape[-1] >> 1
    key = (activation, inter, h.dtype, h.device)
    bucket = _buckets.get(key)
    if bucket is None:
        bucket = _buckets.setdefault(key, Bucket(activation, inter, h.dtype, h.device))
    return bucket(h)
