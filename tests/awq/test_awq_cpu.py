"""awq_cpu: GPTQModel's steps, its output against the golden one, and the dense path
when the fused op is missing."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantcore.backends.aten_cpu.kernel import AtenCpuGPTQ
from quantcore.backends.awq_cpu.kernel import AwqCpu
from quantcore.backends.awq_cpu.transform import AWQToInt4PackCPU, awq_zero_offsets
from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.formats.awq import AWQ
from quantcore.ops.linear import linear_reference
from quantcore.probe import probe
from quantcore.problem import Problem
from quantcore.selection import explain
from quantcore.transforms import AWQToGPTQ, gptq_format_for


def _awq(fmt: AWQ, seed: int = 0) -> dict[str, torch.Tensor]:
    return fmt.quantize(torch.randn(128, 256, generator=torch.Generator().manual_seed(seed)) * 0.05)


def test_zero_offsets_formula() -> None:
    """(2^(b−1) − z)·s: with q − 8 scaled and the offset added, (q − z)·s comes back."""
    z, s, q = torch.tensor([0, 8, 15]), torch.tensor([0.5, 0.25, 2.0]), torch.tensor([3, 9, 15])
    off = awq_zero_offsets(z, s, 4)
    assert off.tolist() == [4.0, 0.0, -14.0]
    assert torch.equal((q - 8) * s + off, (q - z) * s)


@pytest.mark.parametrize("group_size", [32, 128, -1])
def test_restored_metadata_per_sub_group(group_size: int) -> None:
    fmt = AWQ(group_size=group_size)
    t = _awq(fmt)
    p = AWQToInt4PackCPU(fmt).apply(t)
    gs = 256 if group_size == -1 else group_size
    assert gs % p.group_size == 0
    sub = torch.arange(0, 256, p.group_size) // gs
    s = t["scales"].float()
    assert torch.equal(p.scales_offsets[..., 0], s[sub])
    assert torch.equal(p.scales_offsets[..., 1], (8 - fmt.unpack_zeros(t).float()[sub]) * s[sub])


@pytest.mark.parametrize("zero_point", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_awq_cpu_matches_golden_and_aten_cpu(zero_point: bool, dtype: torch.dtype) -> None:
    fmt = AWQ(group_size=64, zero_point=zero_point)
    t = _awq(fmt, seed=3)
    t["bias"] = torch.randn(128).half()
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(4)).to(dtype)
    kernel = AwqCpu(fmt, "cpu")
    y = kernel(x, kernel.prepare(t, dtype=dtype))
    verdict = compare(y, linear_reference(x, fmt.dequantize(t), t["bias"]), tolerance_for(dtype))
    assert verdict.ok, verdict.problem
    # The same op on the same repacked tensors: aten_cpu on the GPTQ lanes agrees exactly.
    gfmt = gptq_format_for(fmt)
    other = AtenCpuGPTQ(gfmt, "cpu")
    assert torch.equal(y, other(x, other.prepare(AWQToGPTQ(fmt).apply(t), dtype=dtype)))


def test_dense_path_when_the_fused_op_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch without the CPU int4pack ops: awq_cpu is refused with the reason and the
    dense AWQ dequantize-then-matmul kernel is chosen."""
    caps = dataclasses.replace(probe("cpu"), aten_ops=frozenset())
    reason = AwqCpu.check_device(caps)
    assert reason and "_convert_weight_to_int4pack_for_cpu has no cpu kernel" in reason
    import quantcore.selection as selection

    monkeypatch.setattr(selection, "probe", lambda device: caps)
    fmt = AWQ(group_size=128)
    table = explain(fmt, "cpu", problem=Problem.linear(fmt, M=1, K=256, N=128))
    assert table.selected.kernel == "torch_fallback"
    assert next(c for c in table.candidates if c.kernel == "awq_cpu").reason == reason


def test_supports_follows_the_op() -> None:
    fmt = AWQ(group_size=128)
    assert AwqCpu.supports(Problem.linear(fmt, M=1, K=4096, N=4096)).ok
    ok, why = AwqCpu.supports(Problem.linear(fmt, M=1, K=256, N=40))
    assert not ok and "N=40" in why
