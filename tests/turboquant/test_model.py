"""Model-level API: quantize_model, save_quantized / load_quantized, TurboQuantLinear."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from quantcore.errors import KernelInputError, TensorFormatError
from quantcore.formats.turboquant import TurboQuant
from quantcore.nn.turboquant.model import (
    TurboQuantConfig,
    TurboQuantLinear,
    load_quantized,
    quantize_model,
    save_quantized,
)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(128, 256)
        self.down = nn.Linear(256, 128, bias=False)
        self.odd = nn.Linear(100, 128)  # in_features not a multiple of the group: kept
        self.lm_head = nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.down(torch.relu(self.up(x))))


def _model() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


def test_quantize_model_replaces_eligible_linears_only() -> None:
    model = quantize_model(_model(), TurboQuantConfig(group_size=64))
    assert isinstance(model.up, TurboQuantLinear) and isinstance(model.down, TurboQuantLinear)
    assert type(model.odd) is nn.Linear and type(model.lm_head) is nn.Linear
    assert "tq4-g64" in repr(model.up)


def test_quantized_model_tracks_the_float_model() -> None:
    ref = _model()
    x = torch.randn(5, 128)
    for residual, bound in ((False, 0.15), (True, 0.02)):
        model = _model()
        model.load_state_dict(ref.state_dict())
        quantize_model(model, TurboQuantConfig(group_size=64, residual=residual))
        with torch.no_grad():
            err = (model(x) - ref(x)).norm() / ref(x).norm()
        assert err < bound


def test_rotations_differ_across_layers_and_repeat_across_runs() -> None:
    a = quantize_model(_model(), TurboQuantConfig(group_size=64, seed=7))
    b = quantize_model(_model(), TurboQuantConfig(group_size=64, seed=7))
    rot = {name: getattr(m, name).tensors()["rotation"] for m, name in ((a, "up"), (a, "down"))}
    assert torch.equal(rot["up"], b.up.tensors()["rotation"])
    assert not torch.equal(rot["up"], rot["down"][:, :64, :64])


@pytest.mark.parametrize("offload", [False, True])
def test_save_load_round_trip_from_a_meta_skeleton(tmp_path: Path, offload: bool) -> None:
    model = quantize_model(_model(), TurboQuantConfig(group_size=64, residual=True))
    path = tmp_path / "tq.safetensors"
    save_quantized(model, path)
    with torch.device("meta"):
        skeleton = _model()
    loaded = load_quantized(skeleton, path, cpu_offload_pass2=offload)
    x = torch.randn(3, 128)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert loaded.up.cpu_offload_pass2 is offload


def test_offload_on_cpu_gives_the_resident_outputs_and_prefetches_one_layer_ahead() -> None:
    model = quantize_model(_model(), TurboQuantConfig(group_size=64, residual=True, cpu_offload_pass2=True))
    resident = quantize_model(_model(), TurboQuantConfig(group_size=64, residual=True))
    pool = model.up._pool
    assert pool is model.down._pool
    x = torch.randn(4, 128)
    with torch.no_grad():
        for step in range(3):
            before = pool.copies
            assert torch.equal(model(x), resident(x))
            if step:  # two layers, two slots: after the first forward nothing moves
                assert pool.copies - before == 0
    assert [e.name for e in pool.chain] == [model.up._offloaded.name, model.down._offloaded.name]
    # Pass 2 is in host memory and stays there when the model moves; pass 1 moves.
    assert model.up._pass2_names and all(n.startswith("passes_1_") for n in model.up._pass2_names)


def test_offload_chain_of_three_prefetches_each_layer_once_per_step() -> None:
    from quantcore.nn.turboquant.model import enable_pass2_offload

    gen = torch.Generator().manual_seed(5)
    fmt = TurboQuant(group_size=64, residual=True)
    layers = [TurboQuantLinear.from_linear(nn.Linear(64, 64), fmt, generator=gen) for _ in range(3)]
    resident = nn.Sequential(*layers)
    offloaded = nn.Sequential(*[TurboQuantLinear(64, 64, fmt) for _ in range(3)])
    offloaded.load_state_dict(resident.state_dict())
    pool = enable_pass2_offload(offloaded)
    x = torch.randn(2, 64)
    with torch.no_grad():
        offloaded(x)
        for _ in range(3):
            before = pool.copies
            assert torch.equal(offloaded(x), resident(x))
            assert pool.copies - before == 3


def test_load_errors(tmp_path: Path) -> None:
    model = quantize_model(_model(), TurboQuantConfig(group_size=64))
    path = tmp_path / "tq.safetensors"
    save_quantized(model, path)

    class Other(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(128, 512)

    with pytest.raises(TensorFormatError, match="'up' is saved as a 128 → 256"):
        load_quantized(Other(), path)
    with pytest.raises(TensorFormatError, match="no TurboQuant layer with a residual"):
        load_quantized(_model(), path, cpu_offload_pass2=True)


def test_module_checks_its_inputs() -> None:
    with pytest.raises(KernelInputError, match="multiple of group_size"):
        TurboQuantLinear(100, 64, TurboQuant())
    layer = TurboQuantLinear.from_linear(nn.Linear(128, 32), TurboQuant(group_size=64))
    with pytest.raises(TensorFormatError, match="N=64 \\(module: 32\\)"):
        layer.load_tensors(TurboQuant(group_size=64).quantize(torch.randn(64, 128)) | {"bias": torch.zeros(64)})
    with pytest.raises(KernelInputError, match="carry no bias"):
        layer.load_tensors(TurboQuant(group_size=64).quantize(torch.randn(32, 128)))
    with pytest.raises(KernelInputError, match=r"expected \[\.\.\., 128\]"):
        layer(torch.randn(2, 64))
    with pytest.raises(KernelInputError, match="no residual pass"):
        layer.offload_pass2(None)  # type: ignore[arg-type]


def test_the_module_runs_behind_bind_and_falls_back_past_a_failing_kernel() -> None:
    """TurboQuantLinear goes through ``bind``, as QuantLinear does: a kernel that fails on
    the weight is passed over for the next candidate, and the output is unchanged."""
    from typing import Any, ClassVar

    import quantcore
    from quantcore.kernel import Requirements
    from quantcore.kernels.turboquant.base import TurboQuantLinearKernel
    from quantcore.registry import hookimpl

    class BrokenVendor(TurboQuantLinearKernel):
        name: ClassVar[str] = "tq_broken_vendor"
        priority: ClassVar[int] = 10_000
        requires: ClassVar[Requirements] = Requirements(device_types=frozenset({"cpu"}))

        def prepare(self, tensors: Any, *, dtype: torch.dtype | None = None) -> Any:
            raise RuntimeError("vendor library not initialised")

    class Plugin:
        @hookimpl
        def quantcore_kernels(self) -> list[Any]:
            return [BrokenVendor]

    fmt = TurboQuant(group_size=64, residual=True)
    layer = TurboQuantLinear.from_linear(nn.Linear(128, 32), fmt, generator=torch.Generator().manual_seed(9))
    x = torch.randn(3, 128)
    with torch.no_grad():
        expected = layer(x)
    name = quantcore.register(Plugin(), name="tq_broken_vendor_plugin")
    try:
        fresh = TurboQuantLinear(128, 32, fmt)
        fresh.load_tensors(layer.tensors())
        with torch.no_grad():
            assert torch.equal(fresh(x), expected)
        assert fresh.kernel is not None and fresh.kernel.name != "tq_broken_vendor"
        assert ("tq_broken_vendor", "prepare raised RuntimeError: vendor library not initialised") in fresh.passed_over
    finally:
        quantcore.unregister(name)
