"""quantcore.triton.launch with fixed pointers: the weight's tensors handed to the launcher
as addresses.

No GPU here: as in test_triton_launch.py, a real ``JITFunction`` whose compile step is
replaced (Triton's own binder decides the specialisation) and a recorder standing in for
the compiled kernel's launcher, so what each call hands the launcher is checked: the
tensors at the binding call (``kernel[grid]``), their ``data_ptr()`` ints after it, and
a call's own tensor whenever a fixed position holds another object.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
import triton.language as tl
from triton import knobs

from quantcore.triton import launch as launch_mod
from quantcore.triton.launch import Launch
from tests.core.test_triton_launch import FakeJIT


def weights_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, BLOCK: tl.constexpr):  # pragma: no cover - never run
    pass


FIXED = (1, 2, 3)  # w, s, b: the weight's
VARYING = (0, 5)  # x, M
GRID = (4, 1, 1)
#: Where the runtime arguments start in a call of the compiled kernel's launcher (grid,
#: stream, function, metadata, launch metadata, hooks before them).
ARGS = 9


@pytest.fixture(autouse=True)
def cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in CUDA runtime: device 0 current, stream 77."""
    monkeypatch.setattr(launch_mod._Cuda, "device", lambda: 0)
    monkeypatch.setattr(launch_mod._Cuda, "stream", lambda index: 77 + index)
    # the fakes load no binary (a real launch earlier in a GPU session put the driver's opt-in here)
    monkeypatch.setattr(launch_mod._Cuda, "shared_opt_in", lambda kernel: None)


def _aligned(n: int = 64, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    t = torch.randn(n, dtype=dtype)
    assert t.data_ptr() % 16 == 0
    return t


def _weight() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    words = torch.randint(-2**31, 2**31 - 1, (64,), dtype=torch.int32)
    assert words.data_ptr() % 16 == 0
    return words, _aligned(), _aligned()


def _launch(fixed: tuple[int, ...] = FIXED, device: torch.device | None = None) -> tuple[Launch, FakeJIT]:
    fn = FakeJIT(weights_kernel)
    return Launch(fn, constexprs={"BLOCK": 64}, varying=VARYING, fixed_pointers=fixed,
                  device=device or torch.device("cuda", 0)), fn


def _passed(call: tuple[Any, ...]) -> list[Any]:
    """The runtime arguments a launcher call was handed (the constexpr after them dropped)."""
    return list(call[1 + ARGS:-1])


def _same(got: list[Any], want: list[Any]) -> bool:
    """Each argument the very object wanted (a tensor) or an equal int of the same type."""
    return len(got) == len(want) and all(
        g is v if isinstance(v, torch.Tensor) else type(g) is type(v) and g == v for g, v in zip(got, want, strict=True))


def test_the_binding_call_passes_the_tensors_and_later_calls_their_addresses() -> None:
    launch, fn = _launch()
    w, s, b = _weight()
    x, y = _aligned(), _aligned()
    launch(GRID, x, w, s, b, y, 7)
    assert len(fn.slow) == 1 and not fn.fast
    assert all(a is t for a, t in zip(fn.slow[0][2:], (x, w, s, b, y), strict=False))  # kernel[grid], the tensors
    for _ in range(3):
        x, y = _aligned(), _aligned()  # the activation and output differ at every call
        launch(GRID, x, w, s, b, y, 7)
        assert _same(_passed(fn.fast[-1]), [x, w.data_ptr(), s.data_ptr(), b.data_ptr(), y, 7])
    assert len(fn.slow) == 1 and len(fn.fast) == 3
    assert fn.fast[-1][-1] == 64  # the constexpr, in its position


def test_a_new_specialisation_binds_through_triton_with_the_tensors() -> None:
    launch, fn = _launch()
    w, s, b = _weight()
    base, y = _aligned(80), _aligned()
    launch(GRID, base, w, s, b, y, 7)
    launch(GRID, base[1:], w, s, b, y, 1)  # unaligned x, M == 1: another binary
    assert launch.bound == 2 and len(fn.slow) == 2 and not fn.fast
    assert all(a is t for a, t in zip(fn.slow[1][3:6], (w, s, b), strict=True))
    launch(GRID, base, w, s, b, y, 7)
    launch(GRID, base[1:], w, s, b, y, 1)
    ints = [w.data_ptr(), s.data_ptr(), b.data_ptr()]
    assert [k for k, *_ in fn.fast] == [fn.slow[0][0], fn.slow[1][0]]
    assert all(_same(_passed(call)[1:4], ints) for call in fn.fast)


@pytest.mark.parametrize("which", [1, 2, 3])
def test_another_object_at_a_fixed_position_is_launched_with_its_own_tensor(which: int) -> None:
    launch, fn = _launch()
    weight = list(_weight())
    x, y = _aligned(), _aligned()
    launch(GRID, x, *weight, y, 7)
    other = list(weight)
    # A view of the same memory is another object too: the launcher checks it as given.
    other[which - 1] = weight[which - 1].view(weight[which - 1].shape) if which == 2 else weight[which - 1].clone()
    launch(GRID, x, *other, y, 7)
    got = _passed(fn.fast[-1])
    assert _same(got, [x, *other, y, 7])  # every tensor as given, never the kept addresses
    assert launch.bound == 1 and len(fn.slow) == 1
    launch(GRID, x, *weight, y, 7)  # the kept tensors again: their addresses again
    assert _same(_passed(fn.fast[-1]), [x, *(t.data_ptr() for t in weight), y, 7])


def test_none_at_a_fixed_position_stays_none() -> None:
    launch, fn = _launch()
    w, s, _ = _weight()
    x, y = _aligned(), _aligned()
    for _ in range(2):
        launch(GRID, x, w, s, None, y, 7)
    got = _passed(fn.fast[0])
    assert _same(got[:3], [x, w.data_ptr(), s.data_ptr()]) and got[3] is None


def test_profiler_hooks_get_the_tensors() -> None:
    launch, fn = _launch()
    w, s, b = _weight()
    x, y = _aligned(), _aligned()
    launch(GRID, x, w, s, b, y, 7)
    seen: list[Any] = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        launch(GRID, x, w, s, b, y, 7)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    assert _same(_passed(fn.fast[0]), [x, w, s, b, y, 7])


def test_fixed_pointer_positions_are_checked_when_the_launch_is_made() -> None:
    fn = FakeJIT(weights_kernel)
    for fixed in ((6,), (-1,), (0,), (1, 5)):  # beyond the runtime arguments, negative, varying ones
        with pytest.raises(TypeError, match="fixed pointer positions"):
            Launch(fn, constexprs={"BLOCK": 64}, varying=VARYING, fixed_pointers=fixed, device=torch.device("cuda", 0))
    with pytest.raises(TypeError, match="nor fixed descriptors"):  # a position cannot be both
        Launch(fn, constexprs={"BLOCK": 64}, varying=VARYING, fixed_descriptors=(1,), fixed_pointers=(1, 2),
               device=torch.device("cuda", 0))


def test_a_fixed_position_that_holds_no_tensor_is_refused_before_anything_is_launched() -> None:
    launch, fn = _launch()
    w, s, _ = _weight()
    with pytest.raises(TypeError, match=r"fixed pointer position 3 \(b_ptr\) expects a tensor or None, got a int"):
        launch(GRID, _aligned(), w, s, 12345, _aligned(), 7)
    assert launch.bound == 0 and not fn.slow and not fn.fast


def test_the_bound_launch_keeps_the_fixed_tensors_and_nothing_else() -> None:
    launch, fn = _launch()
    w, s, b = _weight()
    x, y = _aligned(), _aligned()
    for _ in range(2):
        launch(GRID, x, w, s, b, y, 7)
    kept = [weakref.ref(t) for t in (w, s, b)]
    per_call = [weakref.ref(t) for t in (x, y)]
    fn.slow.clear()
    fn.fast.clear()  # the recorder's calls hold every argument too
    del w, s, b, x, y
    gc.collect()
    assert all(ref() is not None for ref in kept)  # their addresses stay valid while the launch lives
    assert all(ref() is None for ref in per_call)
    del launch
    gc.collect()
    assert all(ref() is None for ref in kept)


def test_a_launch_on_another_device_type_passes_the_tensors() -> None:
    launch, fn = _launch(device=torch.device("cpu"))
    w, s, b = _weight()
    x, y = _aligned(), _aligned()
    for _ in range(2):
        launch(GRID, x, w, s, b, y, 7)
    assert launch.fallback and len(fn.slow) == 2 and not fn.fast
    assert all(a is t for a, t in zip(fn.slow[1][2:], (x, w, s, b, y), strict=False))


def _own_launch() -> tuple[Launch, FakeJIT]:
    """y (position 4) the caller's own output."""
    fn = FakeJIT(weights_kernel)
    return Launch(fn, constexprs={"BLOCK": 64}, varying=VARYING, fixed_pointers=FIXED, own_pointers=(4,),
                  device=torch.device("cuda", 0)), fn


def test_an_own_output_is_passed_as_its_address_read_at_every_call() -> None:
    launch, fn = _own_launch()
    w, s, b = _weight()
    x, y = _aligned(), _aligned()
    launch(GRID, x, w, s, b, y, 7)
    assert fn.slow[0][6] is y  # kernel[grid]: the tensor
    for _ in range(3):
        x, y = _aligned(), _aligned()  # a fresh output at every call
        launch(GRID, x, w, s, b, y, 7)
        assert _same(_passed(fn.fast[-1]), [x, w.data_ptr(), s.data_ptr(), b.data_ptr(), y.data_ptr(), 7])
    other = s.clone()  # another object at a fixed position: those as given, the own output still an address
    launch(GRID, x, w, other, b, y, 7)
    assert _same(_passed(fn.fast[-1]), [x, w, other, b, y.data_ptr(), 7])


def test_own_pointer_positions_are_checked_when_the_launch_is_made_and_bound() -> None:
    fn = FakeJIT(weights_kernel)
    for own in ((6,), (0,), (1,)):  # beyond the runtime arguments, varying, fixed
        with pytest.raises(TypeError, match="own pointer positions"):
            Launch(fn, constexprs={"BLOCK": 64}, varying=VARYING, fixed_pointers=FIXED, own_pointers=own,
                   device=torch.device("cuda", 0))
    launch, fn = _own_launch()
    with pytest.raises(TypeError, match=r"own pointer position 4 \(y_ptr\) expects a tensor, got a NoneType"):
        launch(GRID, _aligned(), *_weight(), None, 7)
    assert launch.bound == 0 and not fn.slow and not fn.fast


def test_a_launch_on_a_stream_its_caller_read_asks_for_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    launch, fn = _launch()
    w, s, b = _weight()
    x, y = _aligned(), _aligned()
    launch(GRID, x, w, s, b, y, 7)
    monkeypatch.setattr(launch_mod._Cuda, "stream", lambda index: pytest.fail("the stream was read again"))
    launch.on(5, GRID, x, w, s, b, y, 7)
    assert fn.fast[-1][4] == 5 and _same(_passed(fn.fast[-1]), [x, w.data_ptr(), s.data_ptr(), b.data_ptr(), y, 7])
