"""turboquant_triton's bound launches (fused.py): one bucket per path, dtypes and M
bucket, kept with the layer's codebook; a fixed argument never changes its
specialisation within a bucket; other passes (the offload path's views) or another state
are bound anew; and the kernel's call still checks every activation.

The launch is replaced by a recorder where the test is about those decisions (no GPU),
with the planning of the interpreter and of a stand-in H100.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from quantcore.backends.turboquant_triton import TurboQuantTriton
from quantcore.backends.turboquant_triton import fused as fused_mod
from quantcore.errors import KernelInputError
from quantcore.formats.turboquant import TurboQuant
from quantcore.ops.linear import linear_reference
from quantcore.ops.tolerance import compare, tolerance_for
from quantcore.probe.card_tables import H100_SXM
from tests.launch_recorder import Recorder, assert_fixed_arguments_specialise_alike, record_launches

from ..interpreting import INTERPRETER, NOT_INTERPRETED


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    return record_launches(monkeypatch, fused_mod)


def _layer(fmt: TurboQuant, n: int = 96, k: int = 512, dtype: torch.dtype = torch.bfloat16) -> tuple[Any, Any, Any]:
    gen = torch.Generator().manual_seed(n + k)
    t = fmt.quantize(torch.randn(n, k, generator=gen) * 0.05, generator=gen)
    t["bias"] = torch.randn(n, generator=gen)
    kernel = TurboQuantTriton(fmt, "cpu")
    return kernel, kernel.prepare(t, dtype=dtype), t


@pytest.mark.parametrize("planning", ["interpreter", "gpu"])
@pytest.mark.parametrize("fmt", [TurboQuant(group_size=64, residual=True),
                                 TurboQuant(group_size=32, rotation_per_group=True)], ids=lambda f: f.slug)
def test_fixed_arguments_specialise_alike_on_every_call_of_a_bucket(
    recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch, planning: str, fmt: TurboQuant,
) -> None:
    if planning == "gpu":
        monkeypatch.setattr(fused_mod, "interpreting", lambda: False)
        monkeypatch.setattr(fused_mod, "_card", lambda device: H100_SXM)
        monkeypatch.setattr(fused_mod, "_paths", {})  # the H100's path thresholds, not a CPU's kept from before
    kernel, prepared, _ = _layer(fmt)
    base = torch.randn(300 * 512 + 8).to(torch.bfloat16)
    for m in (1, 1, 2, 7, 16, 17, 40, 64, 100, 256, 300):
        for offset in (0, 1):  # an aligned and an unaligned activation
            y = kernel(base[offset:offset + m * 512].view(m, 512), prepared)
            assert y.shape == (m, 96)
    prefill = "fold_kernel" if fmt.residual else "dequant_kernel"  # two passes fold from M = 256
    assert {r.fn.__name__ for r in recorded} >= {"gemv_kernel", "mma_kernel", prefill}
    assert_fixed_arguments_specialise_alike(recorded)
    before = len(recorded)
    kernel(base[:512].view(1, 512), prepared)
    assert len(recorded) == before  # every bucket kept


def test_other_passes_and_another_state_are_bound_anew(recorded: list[Recorder]) -> None:
    kernel, prepared, _ = _layer(TurboQuant(group_size=64, residual=True))
    x = torch.randn(1, 512).to(torch.bfloat16)
    kernel(x, prepared)
    kernel(x, prepared)
    assert len(recorded) == 1 and len(recorded[0].calls) == 2
    # The custom op rebuilds the state objects around the same tensors at every call.
    rebuilt = dataclasses.replace(prepared, passes=tuple(dataclasses.replace(p) for p in prepared.passes))
    kernel(x, rebuilt)
    assert len(recorded) == 1 and len(recorded[0].calls) == 3
    views = prepared.passes[1].map(torch.clone)  # the offload path hands pass 2 in from a scratch view
    kernel.run_passes(x, (prepared.passes[0], views), prepared, bias=prepared.bias, out_dtype=x.dtype)
    assert len(recorded) == 2
    kernel.run_passes(x, (prepared.passes[0], views), prepared, bias=prepared.bias, out_dtype=x.dtype)
    kernel(x, prepared)
    assert len(recorded) == 2  # each set of passes keeps its bucket
    moved = dataclasses.replace(prepared, codebook=prepared.codebook.clone())
    kernel(x, moved)
    # Bound over the new codebook's memory (never the codebook itself: it owns the state).
    bound = recorded[2].calls[0][1][8]
    assert len(recorded) == 3 and bound is not moved.codebook and bound.data_ptr() == moved.codebook.data_ptr()


@pytest.mark.skipif(not INTERPRETER, reason=NOT_INTERPRETED)
def test_after_binding_every_call_is_still_checked() -> None:
    fmt = TurboQuant(group_size=64)
    kernel, prepared, t = _layer(fmt, 40, 128)
    x = torch.randn(3, 256).to(torch.bfloat16)
    ref = linear_reference(x[:, :128], fmt.dequantize(t), t["bias"])
    for _ in range(2):
        assert compare(kernel(x[:, :128], prepared), ref, tolerance_for(torch.bfloat16)).ok  # strided: copied
    with pytest.raises(KernelInputError, match=r"expected \[\.\.\., 128\]"):
        kernel(x[:, :100], prepared)
    with pytest.raises(KernelInputError, match="bf16/fp16/fp32"):
        kernel(x[:, :128].double(), prepared)
    with pytest.raises(KernelInputError, match="on meta"):
        kernel(torch.empty(3, 128, dtype=torch.bfloat16, device="meta"), prepared)
    with pytest.raises(KernelInputError, match="TurboQuantPrepared"):
        kernel(x[:, :128], {"indices": t["indices"]})  # type: ignore[arg-type]
    with pytest.raises(KernelInputError, match="split_halves"):
        kernel(x[:, :128], dataclasses.replace(prepared, split_halves=True))


def test_a_prepared_states_call_looks_its_bucket_up_once(recorded: list[Recorder],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's own call remembers its bucket per (dtype, M) with the prepared state:
    a second call chooses nothing, and launches the same bucket."""
    kernel, prepared, _ = _layer(TurboQuant(group_size=64, residual=True))
    x = torch.randn(16, 512).to(torch.bfloat16)
    kernel(x, prepared)
    chosen: list[int] = []
    choose = fused_mod._bucket
    monkeypatch.setattr(fused_mod, "_bucket", lambda *a: chosen.append(1) or choose(*a))
    kernel(x, prepared)
    kernel(x, prepared)
    assert chosen == [] and len(recorded) == 1 and len(recorded[0].calls) == 3
    kernel(x[:3], prepared)  # another M chooses once
    kernel(x[:3], prepared)
    kernel(x.half(), prepared)  # another dtype too
    assert chosen == [1, 1]


def test_a_remembered_bucket_is_never_launched_over_what_it_was_not_made_for(recorded: list[Recorder]) -> None:
    """A state with another codebook (moved, or copied with dataclasses.replace, which
    shares the cache dict) or another bias takes a bucket made for what it holds."""
    kernel, prepared, _ = _layer(TurboQuant(group_size=64))
    x = torch.randn(1, 512).to(torch.bfloat16)
    kernel(x, prepared)
    moved = dataclasses.replace(prepared, codebook=prepared.codebook.clone())
    assert moved.cache is prepared.cache
    kernel(x, moved)
    assert len(recorded) == 2
    assert recorded[1].calls[0][1][8].data_ptr() == moved.codebook.data_ptr()
    kernel(x, prepared)  # the routes follow the codebook asked for
    assert recorded[0].calls[-1][1][8].data_ptr() == prepared.codebook.data_ptr()
    rebiased = dataclasses.replace(prepared, bias=prepared.bias + 1)
    kernel(x, rebiased)
    assert len(recorded) == 3 and recorded[2].calls[0][1][11] is rebiased.bias  # the decode kernel's bias


def test_the_routes_a_state_remembers_are_bounded(recorded: list[Recorder]) -> None:
    kernel, prepared, _ = _layer(TurboQuant(group_size=64))
    x = torch.randn(fused_mod.MAX_ROUTES + 8, 512).to(torch.bfloat16)
    for m in range(2, fused_mod.MAX_ROUTES + 8):
        kernel(x[:m], prepared)
    routes = prepared.cache[fused_mod._ROUTES]
    assert 0 < len(routes) <= fused_mod.MAX_ROUTES


@pytest.mark.skipif(not INTERPRETER, reason=NOT_INTERPRETED)
def test_a_rotation_changed_in_place_is_read_again() -> None:
    """The tensor-core path's rotation GEMM keeps the rotations side by side: a remembered
    route still sees a rotation changed in place (the bucket is made again)."""
    fmt = TurboQuant(group_size=64, residual=True, rotation_per_group=True)
    kernel, prepared, t = _layer(fmt, 40, 128)
    x = torch.randn(5, 128).to(torch.bfloat16)
    kernel(x, prepared)
    turned = dict(t, residual_rotation=t["residual_rotation"].flip(-1))  # still orthogonal
    fresh = kernel.prepare(turned, dtype=torch.bfloat16)
    with torch.no_grad():
        prepared.passes[1].rotation.copy_(fresh.passes[1].rotation)
    y = kernel(x, prepared)
    assert torch.equal(y, kernel(x, fresh))
    ref = linear_reference(x, fmt.dequantize(turned), t["bias"])
    assert compare(y, ref, tolerance_for(torch.bfloat16)).ok
    assert not compare(y, linear_reference(x, fmt.dequantize(t), t["bias"]), tolerance_for(torch.bfloat16)).ok
