"""What an eager call of ``turboquant_triton`` asks of torch besides its launches — each
op costs the host microseconds on a GPU, where a call should cost about a launch —
counted as the aten ops that reach the dispatcher, with the launches recorded instead of
run (no GPU).

Per call, after a bucket's first:

* decode (M = 1, a shared rotation): the output, nothing else — the split-K workspace and
  tickets are kept per stream;
* tensor-core kernel rotating x itself, in every program or once per call by the
  launch's first programs (a shared rotation, when asked for): the output and one
  launch, nothing else;
* tensor-core kernel fed by the rotation outside (a rotation per group, always; a shared
  one when forced): the
  output, x viewed as its groups, one GEMM rotating x for every pass (``[P₁ | P₂]`` made
  once);
* dequantize + GEMM: the scratch, the output, the rotation GEMM, the product — no
  concatenation of rotations a call;
* the module (TurboQuantLinear) adds no op to the kernel's.

And what a bucket keeps as a copy — the rotations side by side, the bias in the compute
dtype — follows the layer's tensors when a state dict is loaded into them in place."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from quantcore.backends.turboquant_triton import TurboQuantTriton
from quantcore.backends.turboquant_triton import fused as fused_mod
from quantcore.backends.turboquant_triton.configs import ROTATION_ENV, GemvConfig, PathChoice
from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.formats.turboquant import TurboQuant
from quantcore.nn.turboquant import TurboQuantLinear
from quantcore.ops.linear import linear_reference
from tests.aten_ops import ops_of_call
from tests.launch_recorder import Recorder, record_launches

from ..interpreting import INTERPRETER, NOT_INTERPRETED

pytestmark = pytest.mark.skipif(not INTERPRETER, reason=NOT_INTERPRETED)

K, N, D = 512, 64, 32  # 16 groups: the decode and tensor-core kernels split K
FORMATS = [TurboQuant(group_size=D), TurboQuant(group_size=D, residual=True),
           TurboQuant(group_size=D, rotation_per_group=True, residual=True)]


@contextmanager
def _grad_mode(mode: str) -> Iterator[None]:
    with torch.inference_mode() if mode == "inference" else torch.no_grad():
        yield


def _ops(call: Callable[[], object], mode: str) -> Counter[str]:
    return ops_of_call(call, warm_ups=2, mode=_grad_mode(mode))


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    # M = 1 decodes, M = 2 takes the tensor-core kernel, larger M dequantizes.
    monkeypatch.setitem(fused_mod._paths, torch.device("cpu"), PathChoice(gemv_max_m=1, mma_max_m=2))
    return record_launches(monkeypatch, fused_mod)


def _layer(fmt: TurboQuant, seed: int = 0) -> tuple[dict[str, torch.Tensor], TurboQuantTriton, Any]:
    gen = torch.Generator().manual_seed(seed)
    t = fmt.quantize(torch.randn(N, K, generator=gen) * 0.05, generator=gen)
    t["bias"] = torch.randn(N, generator=gen)
    kernel = TurboQuantTriton(fmt, "cpu")
    return t, kernel, kernel.prepare(t, dtype=torch.float32)


def _rotation(monkeypatch: pytest.MonkeyPatch, where: str | None) -> None:
    """Force the tensor-core kernel's rotation ``kernel`` or ``outside``; None: the default."""
    if where is None:
        monkeypatch.delenv(ROTATION_ENV, raising=False)
    else:
        monkeypatch.setenv(ROTATION_ENV, where)


def _launches(recorded: list[Recorder]) -> int:
    return sum(len(r.calls) for r in recorded)


@pytest.mark.parametrize("mode", ["inference", "no_grad"])
@pytest.mark.parametrize("fmt", FORMATS[:2], ids=lambda f: f.slug)
def test_decode_call_allocates_only_its_output(recorded: list[Recorder], fmt: TurboQuant, mode: str) -> None:
    _, _, prepared = _layer(fmt)
    x = torch.randn(1, K)
    cfg = GemvConfig(gpc=4, ctas=8, br=4, warps=4)  # 4 splits: a workspace and tickets
    ops = _ops(lambda: fused_mod.fused_linear(x, prepared.passes, prepared.codebook, group_size=D, partial=None,
                                              bias=prepared.bias, out_dtype=x.dtype, path="gemv", config=cfg), mode)
    assert ops == Counter(empty=1), ops
    bucket = next(b for b in fused_mod.launch_state(prepared.codebook).values() if isinstance(b, fused_mod._Gemv))
    assert bucket.split == 4


@pytest.mark.parametrize("mode", ["inference", "no_grad"])
@pytest.mark.parametrize("fmt", FORMATS[:2], ids=lambda f: f.slug)
def test_tensor_core_call_is_its_output_and_one_launch(recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch,
                                                       fmt: TurboQuant, mode: str) -> None:
    """A shared rotation the kernel is asked to apply itself: no torch op but the output,
    one launch a call, split over K."""
    _rotation(monkeypatch, "kernel")
    _, kernel, prepared = _layer(fmt)
    x = torch.randn(2, K)
    before = _launches(recorded)
    ops = _ops(lambda: kernel(x, prepared), mode)
    assert [r.fn.__name__ for r in recorded] == ["mma_kernel"] and _launches(recorded) - before == 3
    assert recorded[0].constexprs["ROTATE"] is True
    grid, args = recorded[0].calls[-1]
    assert grid[1] == 4  # split over K: the workspace and tickets are kept, not allocated
    assert args[0] is x  # x as it came: no rotated copy
    assert args[3] is prepared.passes[0].rotation and args[6] is prepared.passes[-1].rotation
    assert ops == Counter(empty=1), ops


@pytest.mark.parametrize("mode", ["inference", "no_grad"])
@pytest.mark.parametrize("fmt", FORMATS[:2], ids=lambda f: f.slug)
def test_tensor_core_call_rotating_once_is_its_output_and_one_launch(
    recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch, fmt: TurboQuant, mode: str,
) -> None:
    """A shared rotation applied once per call by the launch's own rotation programs: no
    torch op but the output, one launch a call (z-slices of rotation programs, then the
    output tiles), the rotated x and its counts kept."""
    from quantcore.backends.turboquant_triton.workspace import rotation_buffers

    _rotation(monkeypatch, "once")
    _, kernel, prepared = _layer(fmt)
    x = torch.randn(2, K)
    before = _launches(recorded)
    ops = _ops(lambda: kernel(x, prepared), mode)
    assert [r.fn.__name__ for r in recorded] == ["mma_kernel"] and _launches(recorded) - before == 3
    assert recorded[0].constexprs["ROTATE_ONCE"] is True and recorded[0].constexprs["ROTATE"] is False
    copies = recorded[0].constexprs["X_COPIES"]
    grid, args = recorded[0].calls[-1]
    split, tiles_n = 4, -(-N // recorded[0].constexprs["BLOCK_N"])
    rotating = -(-copies * (K // D) // (tiles_n * split))  # z-slices holding every chunk (one row tile)
    assert args[19] == rotating >= 1
    assert grid == (tiles_n * split * (rotating + 1), 1, 1)  # the interpreter's grid: one dimension
    assert args[0] is x  # x as it came: rotated by the launch
    xr, counts = rotation_buffers(x.device, 2 * copies * K, prepared.passes[0].rotation.dtype)
    assert args[13] is xr and args[14] is counts
    assert ops == Counter(empty=1), ops


@pytest.mark.parametrize("mode", ["inference", "no_grad"])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.slug)
def test_tensor_core_call_rotating_outside_is_one_rotation_gemm_and_its_launch(
    recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch, fmt: TurboQuant, mode: str,
) -> None:
    """The default (for a shared rotation as for a rotation per group), and forced."""
    _rotation(monkeypatch, None if fmt.rotation_per_group else "outside")
    _, kernel, prepared = _layer(fmt)
    x = torch.randn(2, K)
    before = _launches(recorded)
    ops = _ops(lambda: kernel(x, prepared), mode)
    assert [r.fn.__name__ for r in recorded] == ["mma_kernel"] and _launches(recorded) - before == 3
    assert recorded[0].constexprs["ROTATE"] is False
    assert recorded[0].calls[-1][0][1] == 4  # split over K: a workspace and tickets
    gemms = ops["mm"] + ops["bmm"]
    assert gemms == 1, ops  # both passes rotated by one GEMM
    if fmt.rotation_per_group:  # [G, M, P·d] back to [M, G, P·d]: two transposes and a copy (two ops in no_grad)
        assert sum(ops.values()) <= 7, ops
    else:  # the output, x as [M·G, d], the GEMM; the workspace is kept
        assert ops == Counter(empty=1, view=1, mm=1), ops


@pytest.mark.parametrize("mode", ["inference", "no_grad"])
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.slug)
def test_dequantize_call_concatenates_nothing(recorded: list[Recorder], fmt: TurboQuant, mode: str) -> None:
    _, kernel, prepared = _layer(fmt)
    x = torch.randn(3, K)
    ops = _ops(lambda: kernel(x, prepared), mode)
    assert [r.fn.__name__ for r in recorded] == ["dequant_kernel"]
    assert "cat" not in ops and ops["mm"] + ops["bmm"] + ops["addmm"] == 2, ops  # the rotation, the product
    assert sum(ops.values()) <= (10 if fmt.rotation_per_group else 6), ops


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("fmt", FORMATS[1:2], ids=lambda f: f.slug)
def test_module_adds_no_op_to_the_kernel(recorded: list[Recorder], fmt: TurboQuant, m: int) -> None:
    t, kernel, prepared = _layer(fmt)
    module = TurboQuantLinear(K, N, fmt, device="cpu", dtype=torch.float32)
    module.load_tensors(t, prefer="turboquant_triton")
    assert module.kernel.name == "turboquant_triton"
    x = torch.randn(m, K)
    assert _ops(lambda: module(x), "inference") == _ops(lambda: kernel(x, prepared), "inference")


@pytest.mark.parametrize("fmt", [FORMATS[1], FORMATS[2]], ids=lambda f: f.slug)
def test_a_state_dict_loaded_in_place_is_computed_with(monkeypatch: pytest.MonkeyPatch, fmt: TurboQuant) -> None:
    """A state dict loaded into a module's own buffers (in place) after calls on every
    path: the next calls compute with the new rotations, not the side-by-side copies
    made for the old."""
    monkeypatch.setitem(fused_mod._paths, torch.device("cpu"), PathChoice(gemv_max_m=1, mma_max_m=2))
    modules = []
    for seed in (0, 1):
        t, _, _ = _layer(fmt, seed)
        module = TurboQuantLinear(K, N, fmt, device="cpu", dtype=torch.float32)
        module.load_tensors(t, prefer="turboquant_triton")
        modules.append((module, t))
    (module, _), (source, t_new) = modules
    xs = [torch.randn(m, K, generator=torch.Generator().manual_seed(m)) for m in (1, 2, 3)]
    with torch.no_grad():
        for x in xs:
            module(x)
        buffers = [b for b in module.buffers()]
        module.load_state_dict(source.state_dict())
        assert all(a is b for a, b in zip(buffers, module.buffers(), strict=True))  # loaded in place
        for x in xs:
            ref = linear_reference(x, fmt.dequantize(t_new), t_new["bias"])
            result = compare(module(x), ref, tolerance_for(torch.float32))
            assert result.ok, (x.shape[0], result.problem)


def test_dequantize_bias_in_the_compute_dtype_follows_an_in_place_load() -> None:
    """With bf16 rotations (a GPU's compute dtype) the dequantize path keeps the bias cast
    to bf16: a bias loaded in place after a call is the one added next."""
    import dataclasses

    fmt = FORMATS[1]
    t, _, prepared = _layer(fmt)
    passes = tuple(dataclasses.replace(p, rotation=p.rotation.to(torch.bfloat16)) for p in prepared.passes)
    bias = prepared.bias.clone()
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)

    def call() -> torch.Tensor:
        return fused_mod.fused_linear(x, passes, prepared.codebook, group_size=D, partial=None, bias=bias,
                                      out_dtype=torch.bfloat16, path="dequant")

    call()
    with torch.no_grad():
        bias.add_(1.0)
    result = compare(call(), linear_reference(x, fmt.dequantize(t), bias), tolerance_for(torch.bfloat16))
    assert result.ok, result.problem


@pytest.mark.parametrize(("x_dtype", "wanted"), [(torch.bfloat16, True), (torch.float32, True)])
def test_decode_kernel_multiplies_x_and_a_rotation_of_another_dtype_in_float32(
        recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch, x_dtype: torch.dtype, wanted: bool) -> None:
    """A layer prepared in float32 called in bf16 (as a float32 model is under autocast):
    the decode kernel's rotation dot gets operands of one dtype (``tl.dot`` of bf16 and fp32
    does not compile for the GPU), planned as on a GPU (launches recorded, not run)."""
    monkeypatch.setattr(fused_mod, "interpreting", lambda: False)
    _, _, prepared = _layer(FORMATS[0])  # float32 rotations
    x = torch.randn(1, K).to(x_dtype)
    cfg = GemvConfig(gpc=4, ctas=8, br=4, warps=4)
    fused_mod.fused_linear(x, prepared.passes, prepared.codebook, group_size=D, partial=None, bias=None,
                           out_dtype=x_dtype, path="gemv", config=cfg)
    (launch,) = [r for r in recorded if r.fn.__name__ == "gemv_kernel"]
    assert launch.constexprs["X_ROTATED"] is False and launch.constexprs["DOT_FP32"] is wanted
