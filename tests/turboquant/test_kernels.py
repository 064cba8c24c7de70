"""The TurboQuant kernels on CPU: the torch backend and the Triton kernels under the
interpreter against the golden dequantization, refusals, and input errors."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.turboquant_cutile import TurboQuantCuTile
from quantcore.backends.turboquant_torch import TurboQuantTorch
from quantcore.backends.turboquant_triton import TurboQuantTriton
from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.errors import KernelInputError
from quantcore.formats.turboquant import TurboQuant
from quantcore.kernel import Requirements
from quantcore.ops.linear import linear_reference
from quantcore.probe import Capabilities, PackageStatus, probe
from quantcore.problem import Problem
from quantcore.selection import explain

from ..interpreting import INTERPRETER


@pytest.fixture(scope="module")
def checkpoint() -> tuple[TurboQuant, dict[str, torch.Tensor]]:
    fmt = TurboQuant(group_size=64, residual=True)
    gen = torch.Generator().manual_seed(0)
    t = fmt.quantize(torch.randn(80, 192, generator=gen) * 0.05, generator=gen)
    t["bias"] = torch.randn(80, generator=gen).to(torch.bfloat16)
    return fmt, t


@pytest.mark.parametrize("cls", [TurboQuantTorch, TurboQuantTriton])
@pytest.mark.parametrize("shape", [(1,), (2, 3), (17,)])
def test_matches_golden_with_leading_dims(cls, shape, checkpoint) -> None:  # type: ignore[no-untyped-def]
    if cls is TurboQuantTriton and not INTERPRETER:
        pytest.skip("triton imported before the interpreter could be enabled")
    fmt, t = checkpoint
    kernel = cls(fmt, "cpu")
    prepared = kernel.prepare(t, dtype=torch.bfloat16)
    x = torch.randn(*shape, 192, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y = kernel(x, prepared)
    assert y.shape == (*shape, 80) and y.dtype == torch.bfloat16
    ref = linear_reference(x.reshape(-1, 192), fmt.dequantize(t), t["bias"])
    result = compare(y.reshape(-1, 80), ref, tolerance_for(torch.bfloat16))
    assert result.ok, result.problem


def test_kernel_input_errors(checkpoint) -> None:  # type: ignore[no-untyped-def]
    fmt, t = checkpoint
    kernel = TurboQuantTorch(fmt, "cpu")
    prepared = kernel.prepare(t)
    with pytest.raises(KernelInputError, match=r"expected \[\.\.\., 192\]"):
        kernel(torch.randn(2, 100), prepared)
    with pytest.raises(KernelInputError, match="bf16/fp16/fp32"):
        kernel(torch.randn(2, 192).to(torch.float64), prepared)
    with pytest.raises(KernelInputError, match="TurboQuantPrepared"):
        kernel(torch.randn(2, 192), {"indices": t["indices"]})
    with pytest.raises(KernelInputError, match="dtype"):
        kernel.prepare(t, dtype=torch.int8)


def test_fused_kernels_refuse_group_sizes_outside_their_tiles() -> None:
    problem = Problem.linear(TurboQuant(group_size=48), M=1, K=96, N=64)
    assert not TurboQuantTriton.supports(problem)
    assert not TurboQuantCuTile.supports(problem)
    assert TurboQuantTorch.supports(problem)
    assert "K=100" in TurboQuantTorch.supports(Problem.linear(TurboQuant(), K=100)).reason


def test_cutile_is_refused_cleanly_without_a_gpu_or_without_its_compiler() -> None:
    assert "runs on cuda" in (TurboQuantCuTile.check_device(probe("cpu")) or "")
    caps = Capabilities("cuda:0", "cuda", True, compute_capability=(9, 0),
                        packages=(PackageStatus("cuda.tile", "1.7.0", False, "tileiras compiler not on PATH"),))
    assert "tileiras" in (TurboQuantCuTile.check_device(caps) or "")
    ampere_less = Capabilities("cuda:0", "cuda", True, compute_capability=(7, 5),
                               packages=(PackageStatus("cuda.tile", "1.7.0", True),))
    assert "8.0" in (TurboQuantCuTile.check_device(ampere_less) or "")
    assert isinstance(TurboQuantCuTile.requires, Requirements)


def test_on_cpu_torch_is_selected_and_the_interpreter_ranks_below_it() -> None:
    ex = explain(TurboQuant(), "cpu", problem=Problem.linear(TurboQuant(), M=1, K=256, N=256))
    assert ex.selected is not None and ex.selected.kernel == "turboquant_torch"
    by_name = {c.kernel: c for c in ex.candidates}
    assert by_name["turboquant_triton"].priority < by_name["turboquant_torch"].priority
    assert by_name["turboquant_cutile"].status == "refused"
