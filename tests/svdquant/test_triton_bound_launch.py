"""The SVDQuant Triton kernel's bound launches (triton_launch.py): one bucket per padded
row count, dtype and tile, kept with the prepared weights; a fixed argument never changes
its specialisation within a bucket; every call is still checked. The launch is replaced by
a recorder (no GPU)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from quantcore.backends.triton_nvfp4 import TritonNVFP4
from quantcore.errors import KernelInputError
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.kernels.svdquant import triton_launch
from tests.launch_recorder import Recorder, assert_fixed_arguments_specialise_alike, record_launches


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    return record_launches(monkeypatch, triton_launch)


def _layer(smooth: bool, r: int = 16, n: int = 128) -> tuple[Any, Any]:
    fmt = SVDQuantAct(fp4=True, pad_size=16)
    gen = torch.Generator().manual_seed(r + n)
    tensors = {"lora_down": torch.randn(n, r, generator=gen).bfloat16()}
    if smooth:
        tensors["smooth"] = (torch.rand(n, generator=gen) + 0.5).bfloat16()
    kernel = TritonNVFP4(fmt, "cpu")
    return kernel, kernel.prepare(tensors, dtype=torch.bfloat16)


@pytest.mark.parametrize("smooth", [False, True])
def test_fixed_arguments_specialise_alike_on_every_call_of_a_bucket(recorded: list[Recorder], smooth: bool) -> None:
    kernel, prepared = _layer(smooth)
    gen = torch.Generator().manual_seed(2)
    for m in (1, 1, 5, 16, 17, 31, 40):
        for offset, width in ((0, 128), (1, 128), (0, 136)):  # aligned, unaligned, rows 136 apart
            flat = torch.randn(m * width + 8, generator=gen).bfloat16()
            x = flat[offset:offset + m * width].view(m, width)[:, :128]
            out = kernel(x, prepared)
            assert out.qout.shape[0] == -(-m // 16) * 16
    assert len(recorded) == 3  # M_pad 16, 32, 48
    assert_fixed_arguments_specialise_alike(recorded)


def test_every_call_is_still_checked(recorded: list[Recorder]) -> None:
    kernel, prepared = _layer(True)
    x = torch.randn(3, 128).bfloat16()
    kernel(x, prepared)
    with pytest.raises(KernelInputError, match=r"x: expected \[M, 128\] bfloat16 on cpu"):
        kernel(torch.randn(3, 64).bfloat16(), prepared)
    with pytest.raises(KernelInputError, match="x: expected"):
        kernel(x.half(), prepared)
    with pytest.raises(KernelInputError, match="on meta"):
        kernel(torch.empty(3, 128, dtype=torch.bfloat16, device="meta"), prepared)
    kernel(x, dataclasses.replace(prepared))  # the custom op rebuilds the state around the same tensors
    assert len(recorded) == 1
    _, other = _layer(True, r=32)
    kernel(x, other)
    assert len(recorded) == 2 and sum(len(r.calls) for r in recorded) == 3  # another layer, another bucket
