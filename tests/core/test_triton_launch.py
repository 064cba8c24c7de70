"""quantcore.triton.launch: a kernel bound to its compiled launcher.

No GPU here: the compiled path is driven with a real ``JITFunction`` whose compile step is
replaced (:class:`FakeJIT`: Triton's own binder decides the specialisation, a recorder
stands in for the compiled kernel's launcher), so every decision the fast path makes —
which binary a call runs, what it passes, when it binds again — is checked in CI. Under
Triton's interpreter a real kernel takes the plain path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
from triton.backends.compiler import BaseBackend
from triton.runtime.jit import JITFunction, create_function_from_signature

from quantcore.triton import launch as launch_mod
from quantcore.triton.launch import Launch, launch_state


def scale_kernel(x_ptr, y_ptr, M, stride, SCALE: tl.constexpr, BLOCK: tl.constexpr):  # pragma: no cover - never run
    pass


def typed_kernel(x_ptr, M: i64, BLOCK: tl.constexpr):  # noqa: F821 - a Triton type, read as text  # pragma: no cover
    pass


def misplaced_kernel(x_ptr, BLOCK: tl.constexpr, M):  # pragma: no cover - never run
    pass


class FakeCompiled:
    """A compiled kernel: its launcher records what it was handed."""

    def __init__(self, spec: list[Any], launches: list[tuple[Any, ...]]) -> None:
        self.spec = spec
        self.function = id(self)
        self.packed_metadata = ("warps", "ctas", "shared")
        self._launches = launches

    def run(self, *call: Any) -> None:
        self._launches.append((self, *call))

    def launch_metadata(self, grid: Any, stream: int, *args: Any) -> dict[str, Any]:
        return {"grid": grid, "stream": stream}


class FakeJIT(JITFunction):
    """A JITFunction whose compile is replaced: ``run`` specialises with Triton's binder
    (as the real one does), "compiles" one FakeCompiled per specialisation, and records
    the launch it makes as the slow path."""

    def __init__(self, fn: Any) -> None:
        super().__init__(fn)
        self.compiled: dict[str, FakeCompiled] = {}
        self.slow: list[tuple[Any, ...]] = []  # launches through run()
        self.fast: list[tuple[Any, ...]] = []  # launches through a compiled kernel's launcher

    def create_binder(self) -> Any:
        return {}, {}, None, BaseBackend, create_function_from_signature(self.signature, self.params, BaseBackend)

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> FakeCompiled:
        _, spec, _ = self.device_caches[0][4](*args, **kwargs)
        kernel = self.compiled.setdefault(repr(spec), FakeCompiled(spec, self.fast))
        if not warmup:  # warmup compiles (and loads) only
            self.slow.append((kernel, grid, *args))
        return kernel


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A stand-in CUDA runtime: device 0 current, stream 77, a guard that records."""
    state: dict[str, Any] = {"device": 0, "guards": []}

    @contextlib.contextmanager
    def guard(index: int) -> Any:
        state["guards"].append(index)
        before, state["device"] = state["device"], index
        yield
        state["device"] = before

    monkeypatch.setattr(launch_mod._Cuda, "device", lambda: state["device"])
    monkeypatch.setattr(launch_mod._Cuda, "stream", lambda index: 77 + index)
    monkeypatch.setattr(launch_mod._Cuda, "guard", guard)
    # the fakes load no binary (a real launch earlier in a GPU session put the driver's opt-in here)
    monkeypatch.setattr(launch_mod._Cuda, "shared_opt_in", lambda kernel: None)
    return state


def _aligned(n: int = 64, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    t = torch.randn(n, dtype=dtype)
    assert t.data_ptr() % 16 == 0
    return t


def test_the_first_call_compiles_through_triton_and_later_ones_call_its_launcher(cuda: dict[str, Any]) -> None:
    fn = FakeJIT(scale_kernel)
    launch = Launch(fn, constexprs={"SCALE": 2.0, "BLOCK": 64}, options={"num_warps": 4}, varying=(0, 2),
                    device=torch.device("cuda", 0))
    x, y = _aligned(), _aligned()
    launch((3, 1, 1), x, y, 5, 64)
    assert len(fn.slow) == 1 and not fn.fast and launch.bound == 1
    for _ in range(3):
        launch((3, 2, 1), x, y, 7, 64)  # M = 7 specialises as M = 5 did
    assert len(fn.slow) == 1 and len(fn.fast) == 3 and launch.bound == 1
    kernel, *call = fn.fast[0]
    assert kernel is fn.slow[0][0]
    # grid, stream, function, metadata, no launch metadata or hooks, every argument, then
    # the constexprs in their positions (the launcher skips them).
    assert call[:9] == [3, 2, 1, 77, kernel.function, kernel.packed_metadata, None, None, None]
    assert call[9:] == [x, y, 7, 64, 2.0, 64]
    assert not cuda["guards"]


@pytest.mark.parametrize(
    ("first", "then", "why"),
    [
        ((0, 5), (1, 5), "an unaligned pointer"),
        ((0, 5), (0, 1), "M == 1 (a constant in its binary)"),
        ((0, 5), (0, 16), "M divisible by 16"),
        ((0, 5), (0, 2**31), "M beyond int32"),
    ],
)
def test_a_call_that_specialises_differently_never_runs_the_other_binary(
    cuda: dict[str, Any], first: tuple[int, int], then: tuple[int, int], why: str,
) -> None:
    fn = FakeJIT(scale_kernel)
    launch = Launch(fn, constexprs={"SCALE": 1.0, "BLOCK": 64}, varying=(0, 2), device=torch.device("cuda", 0))
    base = _aligned(80)
    y = _aligned()
    (o1, m1), (o2, m2) = first, then
    launch((1, 1, 1), base[o1:], y, m1, 64)
    launch((1, 1, 1), base[o2:], y, m2, 64)
    assert len(fn.compiled) == 2 and launch.bound == 2, why  # bound again, on its own binary
    assert len(fn.slow) == 2 and fn.slow[0][0] is not fn.slow[1][0]
    for _ in range(2):  # alternating: each call on the binary of its own specialisation
        launch((1, 1, 1), base[o1:], y, m1, 64)
        launch((1, 1, 1), base[o2:], y, m2, 64)
    assert [k for k, *_ in fn.fast] == [fn.slow[0][0], fn.slow[1][0]] * 2


def test_the_activation_dtype_is_part_of_the_specialisation(cuda: dict[str, Any]) -> None:
    fn = FakeJIT(scale_kernel)
    launch = Launch(fn, constexprs={"SCALE": 1.0, "BLOCK": 64}, varying=(0,), device=torch.device("cuda", 0))
    y = _aligned()
    launch((1, 1, 1), _aligned(dtype=torch.bfloat16), y, 3, 64)
    launch((1, 1, 1), _aligned(dtype=torch.float16), y, 3, 64)
    assert launch.bound == 2 and len(fn.slow) == 2
    assert [s[0][0] for s in (k.spec for k in fn.compiled.values())] == ["*bf16", "*fp16"]


def test_a_launch_runs_on_its_own_device_whatever_device_is_current(cuda: dict[str, Any]) -> None:
    fn = FakeJIT(scale_kernel)
    launch = Launch(fn, constexprs={"SCALE": 1.0, "BLOCK": 64}, varying=(0,), device=torch.device("cuda", 1))
    x, y = _aligned(), _aligned()
    launch((1, 1, 1), x, y, 3, 64)
    launch((1, 1, 1), x, y, 3, 64)
    assert cuda["guards"] == [1, 1] and cuda["device"] == 0
    assert fn.fast[0][4] == 78  # device 1's stream


def test_profiler_hooks_get_launch_metadata(cuda: dict[str, Any]) -> None:
    from triton import knobs

    fn = FakeJIT(scale_kernel)
    launch = Launch(fn, constexprs={"SCALE": 1.0, "BLOCK": 64}, varying=(0,), device=torch.device("cuda", 0))
    x, y = _aligned(), _aligned()
    launch((1, 1, 1), x, y, 3, 64)
    seen: list[Any] = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        launch((2, 1, 1), x, y, 3, 64)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    call = fn.fast[0]
    assert call[7] == {"grid": (2, 1, 1), "stream": 77} and call[8] is knobs.runtime.launch_enter_hook


def test_a_disagreement_with_tritons_binder_falls_back_to_the_plain_path(cuda: dict[str, Any]) -> None:
    """An annotated integer specialises by its annotation in Triton's binder, not as the
    native function says: the launcher must not guess, so it takes the plain path."""
    fn = FakeJIT(typed_kernel)
    launch = Launch(fn, constexprs={"BLOCK": 64}, varying=(1,), device=torch.device("cuda", 0))
    x = _aligned()
    for m in (3, 3, 3):
        launch((1, 1, 1), x, m)
    assert "disagrees" in launch.fallback and launch.bound == 0
    assert len(fn.slow) == 3 and not fn.fast


def test_a_launch_on_another_device_type_takes_that_backends_own_path(cuda: dict[str, Any]) -> None:
    """A compiled kernel for a device that is not CUDA (triton-ascend's NPU) is launched
    as its backend launches it: the CUDA runtime queries do not apply there."""
    fn = FakeJIT(scale_kernel)
    launch = Launch(fn, constexprs={"SCALE": 1.0, "BLOCK": 64}, varying=(0,), device=torch.device("cpu"))
    x, y = _aligned(), _aligned()
    for _ in range(2):
        launch((1, 1, 1), x, y, 3, 64)
    assert launch.fallback == "not a CUDA device (cpu)" and len(fn.slow) == 2 and not fn.fast


def test_constexprs_are_checked_when_the_launch_is_made() -> None:
    fn = FakeJIT(scale_kernel)
    with pytest.raises(TypeError, match=r"\['BLOCK'\] missing"):
        Launch(fn, constexprs={"SCALE": 1.0}, device=torch.device("cuda", 0))
    with pytest.raises(TypeError, match=r"\['OTHER'\] unknown"):
        Launch(fn, constexprs={"SCALE": 1.0, "BLOCK": 4, "OTHER": 1}, device=torch.device("cuda", 0))
    with pytest.raises(TypeError, match="outside its 4 arguments"):
        Launch(fn, constexprs={"SCALE": 1.0, "BLOCK": 4}, varying=(4,), device=torch.device("cuda", 0))
    with pytest.raises(TypeError, match="constexpr parameters must come last"):
        Launch(FakeJIT(misplaced_kernel), constexprs={"BLOCK": 4}, device=torch.device("cuda", 0))


def test_a_wrong_number_of_arguments_is_refused_before_anything_is_bound(cuda: dict[str, Any]) -> None:
    fn = FakeJIT(scale_kernel)
    launch = Launch(fn, constexprs={"SCALE": 1.0, "BLOCK": 64}, device=torch.device("cuda", 0))
    with pytest.raises(TypeError, match="4 runtime arguments expected, got 3"):
        launch((1, 1, 1), _aligned(), _aligned(), 3)
    assert launch.bound == 0 and not fn.slow


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs Triton's interpreter (CPU)")
def test_under_the_interpreter_every_call_takes_the_plain_path() -> None:
    @triton.jit
    def double(x_ptr, y_ptr, M, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < M, other=0.0) * 2, mask=offs < M)

    launch = Launch(double, constexprs={"BLOCK": 16}, varying=(0, 2), device=torch.device("cpu"))
    assert launch.fallback == "Triton's interpreter"
    for m in (5, 1, 16):
        x, y = torch.randn(16), torch.zeros(16)
        launch((1, 1, 1), x, y, m)
        assert torch.equal(y[:m], 2 * x[:m]) and not y[m:].any()
    assert launch.bound == 0


@dataclasses.dataclass
class _Prepared:
    w: torch.Tensor


def test_launch_state_is_kept_per_object_and_dropped_with_it() -> None:
    a = _Prepared(torch.zeros(2))
    state = launch_state(a)
    state["bucket"] = 1
    assert launch_state(a) is state
    copy = dataclasses.replace(a)  # same tensors, another object: its own state
    assert launch_state(copy) is not state and "bucket" not in launch_state(copy)
    before = len(launch_mod._states)
    del a
    gc.collect()
    assert len(launch_mod._states) == before - 1


def test_the_compiled_kernel_is_allowed_its_shared_memory_before_its_first_launch(
    cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    fn = FakeJIT(scale_kernel)
    order: list[tuple[str, Any]] = []
    monkeypatch.setattr(launch_mod._Cuda, "shared_opt_in", lambda kernel: order.append(("opt in", kernel)))
    real_run = fn.run

    def run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> FakeCompiled:
        kernel = real_run(*args, grid=grid, warmup=warmup, **kwargs)
        order.append(("compiled" if warmup else "launched", kernel))
        return kernel

    monkeypatch.setattr(fn, "run", run)
    launch = Launch(fn, constexprs={"SCALE": 1.0, "BLOCK": 64}, varying=(0, 2), device=torch.device("cuda", 0))
    x, y = _aligned(), _aligned()
    launch((1, 1, 1), x, y, 5, 64)
    launch((1, 1, 1), x, y, 7, 64)  # bound: no second opt-in
    kernel = fn.slow[0][0]
    assert order == [("compiled", kernel), ("opt in", kernel), ("launched", kernel)]


@pytest.mark.parametrize("given, fits", [(4, 2), (1, 0)])
def test_a_tile_over_the_cards_shared_memory_compiles_with_fewer_stages(
    cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch, given: int, fits: int,
) -> None:
    """A table's tile planned for a card with more shared memory (a 227 KB Hopper tile on a
    99 KB card): Triton raises OutOfResources when it loads the binary. The launch compiles
    it again one stage shallower until it fits (the same arithmetic); a single-stage kernel
    that does not fit still raises."""
    from triton.runtime.errors import OutOfResources

    fn = FakeJIT(scale_kernel)
    stages_tried: list[int] = []
    real_run = fn.run

    def run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> FakeCompiled:
        if warmup:
            stages_tried.append(kwargs["num_stages"])
            if kwargs["num_stages"] > fits:  # the loader's check: over the card's limit
                raise OutOfResources(48_000 * kwargs["num_stages"], 101_376, "shared memory")
        return real_run(*args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(fn, "run", run)
    launch = Launch(fn, constexprs={"SCALE": 1.0, "BLOCK": 64}, options={"num_stages": given, "num_warps": 4},
                    varying=(0, 2), device=torch.device("cuda", 0))
    x, y = _aligned(), _aligned()
    if not fits:
        with pytest.raises(OutOfResources):
            launch((1, 1, 1), x, y, 5, 64)
        return
    launch((1, 1, 1), x, y, 5, 64)
    launch((1, 1, 1), x, y, 7, 64)  # bound at the stages that fit: no compile again
    assert stages_tried == [4, 3, 2] and launch.bound == 1 and len(fn.slow) == 1 and len(fn.fast) == 1
