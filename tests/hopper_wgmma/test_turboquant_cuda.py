"""``hopper_wgmma``'s TurboQuant kernel on an sm_90 GPU, as a user calls it (prepare, then
the kernel; a module that prefers it): against the format's float64 golden at the
conformance tolerance, over every plan kind its calls take (the decode kernel to 8 rows, the
wgmma kernel's 16-row, narrow and wide plans above), one and two passes, shared and
per-group rotations, a bias, N off the 64-row tile, an odd block count; replayed from a
CUDA graph bit for bit; rotations changed in place are the ones the next call uses."""

from __future__ import annotations

import pytest
import torch

from quantcore.formats.turboquant import TurboQuant
from quantcore.ops.tolerance import compare, tolerance_for

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
pytestmark = pytest.mark.skipif(not SM90, reason="the kernel is Gluon for sm_90 (an H100 or H200)")

FORMATS = [TurboQuant(), TurboQuant(residual=True), TurboQuant(rotation_per_group=True, bits=3)]


def _stored(fmt: TurboQuant, n: int, k: int, bias: bool) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(n + k)
    tensors = fmt.quantize(torch.randn(n, k, generator=gen) * 0.02, generator=gen)
    if bias:
        tensors["bias"] = torch.randn(n, generator=gen)
    return {name: t.cuda() for name, t in tensors.items()}


def _golden(fmt: TurboQuant, stored: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    y = x.double() @ fmt.dequantize(stored).t()
    return (y + stored["bias"].double() if "bias" in stored else y).cpu()


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.slug)
@pytest.mark.parametrize(("k", "n"), [(512, 320), (384, 200), (1024, 4096)])
@pytest.mark.parametrize("m", [1, 5, 8, 16, 40, 128, 300])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_call_gives_the_layers_product(fmt: TurboQuant, k: int, n: int, m: int, dtype: torch.dtype) -> None:
    from quantcore.backends.hopper_wgmma.turboquant import HopperWgmmaTurboQuant

    stored = _stored(fmt, n, k, bias=k == 384)
    kernel = HopperWgmmaTurboQuant(fmt, "cuda")
    prepared = kernel.prepare(stored, dtype=dtype)
    x = torch.randn(m, k, device="cuda").to(dtype)
    y = kernel(x, prepared)
    assert y.shape == (m, n) and y.dtype == dtype
    verdict = compare(y, _golden(fmt, stored, x), tolerance_for(dtype))
    assert verdict.ok, verdict.problem
    x3 = x.view(1, m, k)
    assert torch.equal(kernel(x3, prepared).view(m, n), y)  # leading dims, the same bucket


@pytest.mark.parametrize("m", [1, 16, 128])
def test_a_graph_replays_the_eager_call(m: int) -> None:
    from quantcore.backends.hopper_wgmma.turboquant import HopperWgmmaTurboQuant

    fmt = TurboQuant(residual=True)
    kernel = HopperWgmmaTurboQuant(fmt, "cuda")
    prepared = kernel.prepare(_stored(fmt, 512, 1024, bias=True), dtype=torch.bfloat16)
    x = torch.randn(m, 1024, device="cuda").to(torch.bfloat16)
    eager = kernel(x, prepared)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel(x, prepared)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, kernel(x, prepared)) and not torch.equal(out, eager)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.slug)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("direct", [False, True], ids=["through-shared", "direct-loads"])
def test_the_rotation_in_the_launch_gives_the_two_launches_bits(fmt: TurboQuant, dtype: torch.dtype, direct: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.backends.hopper_wgmma import turboquant_launch
    from quantcore.backends.hopper_wgmma.decode_bucket import DecodeBucket
    from quantcore.backends.hopper_wgmma.launch import WgmmaBucket, bucket_of
    from quantcore.backends.hopper_wgmma.turboquant import HopperWgmmaTurboQuant

    monkeypatch.setattr(turboquant_launch, "ROTATION_DIRECT_LOADS", direct)
    stored = _stored(fmt, 1000, 2048, bias=True)
    kernel = HopperWgmmaTurboQuant(fmt, "cuda")
    prepared = kernel.prepare(stored, dtype=dtype)
    for m in (1, 3, 8, 16, 40, 128):  # the decode kernel, then the wgmma kernel's 16-, 64- and 128-row tiles
        xs = [torch.randn(m, 2048, device="cuda").to(dtype) for _ in range(3)]
        monkeypatch.setattr(turboquant_launch, "ROTATION_IN_LAUNCH", "always")
        fused = [kernel(x, prepared) for x in xs]  # one after another: each launch leaves its counts at 0
        assert isinstance(bucket_of(xs[0], prepared, m).rotated, DecodeBucket | WgmmaBucket)
        monkeypatch.setattr(turboquant_launch, "ROTATION_IN_LAUNCH", "never")
        apart = [kernel(x, prepared) for x in xs]
        for x, one, two in zip(xs, fused, apart, strict=True):
            assert torch.equal(one, two)
            verdict = compare(one, _golden(fmt, stored, x), tolerance_for(dtype))
            assert verdict.ok, verdict.problem


def test_rotations_changed_in_place_are_used() -> None:
    from quantcore.backends.hopper_wgmma.turboquant import HopperWgmmaTurboQuant

    fmt = TurboQuant()
    kernel = HopperWgmmaTurboQuant(fmt, "cuda")
    stored = _stored(fmt, 256, 512, bias=False)
    prepared = kernel.prepare(stored, dtype=torch.bfloat16)
    x = torch.randn(4, 512, device="cuda").to(torch.bfloat16)
    kernel(x, prepared)
    other = _stored(fmt, 256, 512, bias=False)
    other["rotation"] = torch.linalg.qr(torch.randn(128, 128, dtype=torch.float64))[0].float()[None].cuda()
    prepared.rotations[0].copy_(other["rotation"][0].t())  # P = Πᵀ, as the layout keeps it
    stored["rotation"] = other["rotation"]
    verdict = compare(kernel(x, prepared), _golden(fmt, stored, x), tolerance_for(torch.bfloat16))
    assert verdict.ok, verdict.problem


def test_a_module_that_prefers_it_runs_it_and_saves_the_format() -> None:
    from quantcore.nn.turboquant import TurboQuantLinear

    fmt = TurboQuant(residual=True)
    stored = _stored(fmt, 384, 1024, bias=True)
    layer = TurboQuantLinear(1024, 384, fmt=fmt, bias=True, device="cuda", dtype=torch.bfloat16)
    layer.load_tensors(stored, prefer="hopper_wgmma")
    assert layer.kernel.name == "hopper_wgmma"
    x = torch.randn(2, 64, 1024, device="cuda").to(torch.bfloat16)
    verdict = compare(layer(x).view(128, 384), _golden(fmt, stored, x.view(128, 1024)), tolerance_for(torch.bfloat16))
    assert verdict.ok, verdict.problem
    saved = layer.tensors()
    assert all(torch.equal(saved[name], stored[name].to(saved[name].dtype)) for name in stored)


@pytest.mark.parametrize("m", [1, 8])
def test_a_deep_narrow_weight_takes_the_wgmma_kernels_few_row_tiles(m: int) -> None:
    """Two passes of K = 9216 (18432 deep) into N = 512: the 8-row wgmma plan
    (``configs.lookup_plan``), not the decode kernel, and the layer's product."""
    from quantcore.backends.hopper_wgmma.launch import plan_of
    from quantcore.backends.hopper_wgmma.plans import Plan
    from quantcore.backends.hopper_wgmma.turboquant import HopperWgmmaTurboQuant

    fmt = TurboQuant(residual=True)
    stored = _stored(fmt, 512, 9216, bias=False)
    kernel = HopperWgmmaTurboQuant(fmt, "cuda")
    prepared = kernel.prepare(stored, dtype=torch.bfloat16)
    plan = plan_of(m, prepared, torch.device("cuda"))
    assert isinstance(plan, Plan) and plan.bm == 8, plan
    x = torch.randn(m, 9216, device="cuda").to(torch.bfloat16)
    verdict = compare(kernel(x, prepared), _golden(fmt, stored, x), tolerance_for(torch.bfloat16))
    assert verdict.ok, verdict.problem
