"""``hopper_wgmma``'s TurboQuant kernel on any machine: what it takes and refuses, its layout
(a lossless round trip to the format's tensors, and the format's own golden weight), the
plans its calls take, and where its declared costs put it beside ``turboquant_triton``.
The kernel's results on the GPU: ``test_turboquant_cuda.py`` and the conformance matrix."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import quantcore.measured as measured
import quantcore.selection as selection
from quantcore.backends.hopper_wgmma.configs import Shape, lookup_plan
from quantcore.backends.hopper_wgmma.layout import hopper_to_rows
from quantcore.backends.hopper_wgmma.plans import DecodePlan, Plan
from quantcore.backends.hopper_wgmma.turboquant import HopperWgmmaTurboQuant
from quantcore.backends.hopper_wgmma.turboquant_layout import TurboQuantHopperWeights
from quantcore.errors import KernelInputError, TensorFormatError, UnsupportedProblemError
from quantcore.formats.gptq import GPTQ
from quantcore.formats.turboquant import TurboQuant
from quantcore.probe import Capabilities, PackageStatus
from quantcore.problem import Problem
from quantcore.registry import Registry

H200 = Capabilities(
    device="cuda:0", device_type="cuda", available=True, name="NVIDIA H200", compute_capability=(9, 0),
    torch_version=torch.__version__, packages=(PackageStatus("triton", "3.6.0", True),
                                               PackageStatus("cuda.tile", None, False, "not installed")),
    aten_ops=frozenset(), fp8=True)


def _stored(fmt: TurboQuant, n: int, k: int, seed: int, bias: bool = False,
            dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A quantized layer; its codebook and bias in ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    tensors = fmt.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen)
    tensors["codebook"] = tensors["codebook"].to(dtype)
    if bias:
        tensors["bias"] = torch.randn(n, generator=gen).to(dtype)
    return tensors


def test_it_is_registered_for_turboquant(registry: Registry) -> None:
    entry = registry.kernel("turboquant", "linear", "hopper_wgmma")
    assert entry.cls is HopperWgmmaTurboQuant


@pytest.mark.parametrize(("fmt", "dtype", "says"), [
    (TurboQuant(group_size=64), torch.bfloat16, "group_size=64"),
    (TurboQuant(norm_dtype=torch.float32), torch.bfloat16, "norm_dtype=float32"),
    (TurboQuant(), torch.float32, "activation dtype fp32"),
    (GPTQ(bits=4, group_size=128), torch.bfloat16, "is not TurboQuant"),
])
def test_it_refuses_what_it_does_not_lay_out(fmt: object, dtype: torch.dtype, says: str) -> None:
    support = HopperWgmmaTurboQuant.supports(Problem.linear(fmt, M=4, K=512, N=256, dtype=dtype))  # type: ignore[arg-type]
    assert not support and says in support.reason


def test_prepare_names_what_is_wrong_with_the_tensors() -> None:
    fmt = TurboQuant(residual=True)
    stored = _stored(fmt, 64, 256, 0)
    with pytest.raises(TensorFormatError, match="codebook"):
        HopperWgmmaTurboQuant(fmt, "cpu").prepare({k: v for k, v in stored.items() if k != "codebook"})
    with pytest.raises(TensorFormatError, match="bias"):
        HopperWgmmaTurboQuant(fmt, "cpu").prepare({**stored, "bias": torch.zeros(3)})


def test_prepare_refuses_other_layouts_and_dtypes() -> None:
    for fmt in (TurboQuant(group_size=64), TurboQuant(norm_dtype=torch.float32)):
        with pytest.raises(UnsupportedProblemError, match=r"groups of 128|within a rounding"):
            HopperWgmmaTurboQuant(fmt, "cpu").prepare(_stored(fmt, 64, 256, 0))
    fmt = TurboQuant()
    with pytest.raises(KernelInputError, match="dtype"):
        HopperWgmmaTurboQuant(fmt, "cpu").prepare(_stored(fmt, 64, 256, 0), dtype=torch.float32)


@pytest.mark.parametrize("fmt", [
    TurboQuant(), TurboQuant(residual=True), TurboQuant(rotation_per_group=True, residual=True),
    TurboQuant(bits=2), TurboQuant(bits=3, residual=True), TurboQuant(norm_dtype=torch.bfloat16),
], ids=lambda f: f.slug)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_layout_round_trips_to_the_stored_tensors(fmt: TurboQuant, bias: bool, dtype: torch.dtype) -> None:
    stored = _stored(fmt, 200, 384, seed=len(fmt.slug), bias=bias, dtype=dtype)  # N off the 64-row tile, 3 blocks
    kernel = HopperWgmmaTurboQuant(fmt, "cpu")
    prepared = kernel.prepare(stored)
    assert type(prepared) is TurboQuantHopperWeights and prepared.passes == len(fmt.passes)
    assert prepared.bias is None and prepared.zeros is None  # the kernels read the codebook in their place
    back = kernel.stored_tensors(prepared)  # what a module saves (TurboQuantLinear.tensors)
    assert sorted(back) == sorted(stored)
    for name, t in stored.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name


@pytest.mark.parametrize("fmt", [TurboQuant(residual=True), TurboQuant(rotation_per_group=True)], ids=lambda f: f.slug)
def test_the_laid_out_layer_is_the_formats_golden_weight(fmt: TurboQuant) -> None:
    """The code matrix read back, looked up in the codebook, times its scales and each
    pass's rotation: the format's own dequantized weight (``TurboQuant.dequantize``)."""
    stored = _stored(fmt, 130, 512, seed=5)
    w = HopperWgmmaTurboQuant(fmt, "cpu").prepare(stored)
    rows = hopper_to_rows(w)
    n, k, p, d = w.out_features, w.layer_in_features, w.passes, w.group_size
    code_w = (w.codebook.double()[rows.codes.long()] * rows.scales.double().t().repeat_interleave(d, 1))
    per_pass = code_w.view(n, k // d, p, d)
    dense = torch.zeros(n, k, dtype=torch.float64)
    for i, rhs in enumerate(w.rotations):  # rhs = Πᵀ: the weight's group is (c·s) Πᵀᵀ = (c·s) Π
        rot = rhs.double().transpose(-1, -2)
        unit = per_pass[:, :, i]
        dense += (unit @ rot[0] if rot.shape[0] == 1 else torch.einsum("ngj,gjk->ngk", unit, rot)).reshape(n, k)
    want = fmt.dequantize(stored)
    # The layout keeps each scale norms/√d in float32 (24 bits), the golden in float64: each
    # pass's term is off by at most 2^-24 of itself, which a sum of passes may leave larger
    # beside the sum, not beside the largest weight.
    assert torch.allclose(dense, want, rtol=0, atol=2 ** -22 * float(want.abs().max()))


def test_a_call_checks_its_input() -> None:
    fmt = TurboQuant()
    kernel = HopperWgmmaTurboQuant(fmt, "cpu")
    prepared = kernel.prepare(_stored(fmt, 64, 256, 1))
    with pytest.raises(KernelInputError, match="x"):
        kernel(torch.randn(2, 128, dtype=torch.bfloat16), prepared)
    with pytest.raises(KernelInputError, match="TurboQuantHopperWeights"):
        kernel(torch.randn(2, 256, dtype=torch.bfloat16), dataclasses.replace(prepared).__dict__)
    assert kernel(torch.randn(0, 256, dtype=torch.bfloat16), prepared).shape == (0, 64)


@pytest.mark.parametrize(("m", "k", "n", "want"), [
    (1, 4096, 14336, DecodePlan(split=4)),
    (8, 14336, 4096, DecodePlan(split=8)),
    (1, 8192, 28672, DecodePlan(split=8)),
    (8, 28672, 4096, Plan(1, 8, 8, 4, in_flight=True)),  # 14336×4096 with its residual pass
    (16, 4096, 14336, Plan(1, 16, 4, 4, in_flight=True)),
    (16, 4096, 4096, Plan(1, 16, 4, 8, in_flight=True)),
    (32, 4096, 14336, Plan(2, 32, 4, 1, in_flight=True, ws=True)),
    (64, 14336, 4096, Plan(1, 64, 4, 4, in_flight=True)),
    (128, 4096, 4096, Plan(1, 128, 4, 2, in_flight=True)),
    (2048, 4096, 14336, Plan(2, 128, 4, 1, in_flight=True, ws=True)),
])
def test_the_plans_are_the_fastest_timed(m: int, k: int, n: int, want: object) -> None:
    """The plan rule is the H200's fastest per shape kind (configs.lookup_plan)."""
    assert lookup_plan(Shape(m, k, n, 4)) == want


@pytest.fixture
def declared_only(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTCORE_CACHE", str(tmp_path))
    monkeypatch.setattr(measured, "SHIPPED", tmp_path)
    monkeypatch.setattr(selection, "probe", lambda device: H200)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(("m", "want"), [(1, "turboquant_triton"), (8, "hopper_wgmma"), (16, "hopper_wgmma"),
                                         (64, "hopper_wgmma"), (128, "hopper_wgmma"), (2048, "turboquant_triton")])
def test_the_declared_costs_take_it_for_batches_of_2_to_128(residual: bool, m: int, want: str, registry: Registry,
                                                            declared_only: None) -> None:
    """As measured on the H200 (README.md): turboquant_triton's decode kernel is faster at one
    row, its dequantize + cuBLAS from 256 rows; this kernel between."""
    fmt = TurboQuant(residual=residual)
    for k, n in ((4096, 14336), (14336, 4096), (4096, 4096)):
        problem = Problem.linear(fmt, M=m, K=k, N=n, dtype=torch.bfloat16)
        expl = selection.explain(fmt, "cuda:0", problem=problem, registry=registry)
        assert expl.selected.kernel == want, expl
