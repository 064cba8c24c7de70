"""quantcore.triton.launch with fixed descriptors: the weight's TMA descriptors encoded once.

No GPU here: the compiled kernel's launcher is Triton 3.6's own ``CudaLauncher`` class
(made without compiling its C module) whose ``launch`` is Triton's own
``wrap_handle_tensordesc`` closure around a recorder standing in for the C launcher. The
encoder (``make_tensordesc_arg``, which calls ``cuTensorMapEncodeTiled``) is replaced by
one that counts its calls and returns a value naming what it encoded; with no metadata
Triton's own encoder runs (it needs no GPU then). So every check compares what the direct
launch hands the C launcher with what Triton's own wrapper hands it for the same call.
"""

from __future__ import annotations

import collections
import gc
import weakref
from typing import Any

import pytest
import torch
import triton.language as tl
from triton import knobs
from triton.backends.nvidia import driver
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime import _allocation

from quantcore.triton import launch as launch_mod
from quantcore.triton.launch import Launch
from tests.core.test_triton_launch import FakeJIT
from tests.triton_release import needs_tested_release

pytestmark = needs_tested_release


def desc_kernel(w_desc, x_desc, s_desc, y_ptr, M, BLOCK: tl.constexpr):  # pragma: no cover - never run
    pass


SIGNATURE = {"w_desc": "tensordesc<i16[4, 8, 256]>", "x_desc": "tensordesc<bf16[4, 16, 32]>",
             "s_desc": "tensordesc<bf16[1, 128]>", "y_ptr": "*bf16", "M": "i32", "BLOCK": "constexpr"}
#: What the compiler records per descriptor when the kernel encodes it on the host (TMA).
TMA_META = [{"swizzle": 0, "elem_size": 2, "elem_type": 4, "block_size": [4, 8, 256], "fp4_padded": False},
            {"swizzle": 3, "elem_size": 2, "elem_type": 10, "block_size": [4, 16, 32], "fp4_padded": False},
            {"swizzle": 0, "elem_size": 2, "elem_type": 10, "block_size": [1, 128], "fp4_padded": False}]
FIXED = (0, 2)  # w and s: the weight's
GRID = (6, 2, 1)
STREAM = 77


class RawLauncher:
    """Stands in for the compiled C launcher: records every argument tuple it is handed."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)


def cuda_launcher(raw: RawLauncher, meta: Any, *, wrapper: Any = None, global_scratch: int = 0,
                  profile_scratch: int = 0) -> driver.CudaLauncher:
    """A CudaLauncher as Triton 3.6 makes one, its C module replaced by ``raw``."""
    launcher = object.__new__(driver.CudaLauncher)
    launcher.num_ctas = 1
    launcher.launch = wrapper or driver.wrap_handle_tensordesc(raw, SIGNATURE, meta)
    launcher.global_scratch_size, launcher.global_scratch_align = global_scratch, 16
    launcher.profile_scratch_size, launcher.profile_scratch_align = profile_scratch, 16
    launcher.launch_cooperative_grid, launcher.launch_pdl = False, True
    return launcher


class Compiled:
    """A compiled kernel whose launcher is ``run``."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.function = 4242
        self.packed_metadata = (4, 1, 1024)

    def launch_metadata(self, grid: Any, stream: int, *args: Any) -> dict[str, Any]:
        return {"grid": grid, "stream": stream}


class DescriptorJIT(FakeJIT):
    """``desc_kernel`` "compiled" to a kernel whose launcher is ``launcher``."""

    def __init__(self, launcher: Any) -> None:
        super().__init__(desc_kernel)
        self.launcher = launcher

    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Compiled:
        _, spec, _ = self.device_caches[0][4](*args, **kwargs)
        kernel = self.compiled.setdefault(repr(spec), Compiled(self.launcher))
        if not warmup:  # warmup compiles (and loads) only
            self.slow.append((kernel, grid, *args))
        return kernel


@pytest.fixture(autouse=True)
def cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_mod._Cuda, "device", lambda: 0)
    monkeypatch.setattr(launch_mod._Cuda, "stream", lambda index: STREAM + index)
    # the fakes load no binary (a real launch earlier in a GPU session put the driver's opt-in here)
    monkeypatch.setattr(launch_mod._Cuda, "shared_opt_in", lambda kernel: None)


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[int]:
    """Encodings per descriptor (by identity): Triton's encoder, or with TMA metadata a
    stand-in for it (it would call the CUDA driver) naming what it encoded."""
    counts: collections.Counter[int] = collections.Counter()
    real = driver.make_tensordesc_arg

    def make(arg: Any, meta: Any) -> list[Any]:
        counts[id(arg)] += 1
        if meta is None:
            return real(arg, meta)
        return [("tensor map", arg.base.data_ptr(), tuple(meta["block_size"])), *arg.shape, *arg.strides]

    monkeypatch.setattr(driver, "make_tensordesc_arg", make)
    return counts


def _layout(rank: int) -> Any:
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=rank)


def _weight() -> tuple[Any, Any, torch.Tensor]:
    w = torch.randint(-2**15, 2**15, (4, 8, 256), dtype=torch.int16)
    s = torch.randn(2, 256).bfloat16()
    return (TensorDescriptor(w, [4, 8, 256], [2048, 256, 1], [4, 8, 256], _layout(3)),
            TensorDescriptor(s, [2, 256], [256, 1], [1, 128], _layout(2)), torch.empty(16, 256).bfloat16())


def _x(m: int = 16) -> Any:
    x = torch.randn(m, 128).bfloat16()
    return TensorDescriptor(x, [4, m, 32], [32, 128, 1], [4, 16, 32], _layout(3))


def _launch(launcher: Any, fixed: tuple[int, ...] = FIXED) -> tuple[Launch, DescriptorJIT]:
    fn = DescriptorJIT(launcher)
    return Launch(fn, constexprs={"BLOCK": 64}, varying=(4,), fixed_descriptors=fixed,
                  device=torch.device("cuda", 0)), fn


def _tritons_call(launcher: driver.CudaLauncher, raw: RawLauncher, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What Triton's launcher hands the C launcher for ``args`` (as the per-call path calls it)."""
    launcher(*GRID, STREAM, 4242, (4, 1, 1024), None, None, None, *args, 64)
    return raw.calls.pop()


@pytest.mark.parametrize("meta", [TMA_META, None], ids=["tma", "no-metadata"])
def test_the_fixed_descriptors_are_encoded_once_and_the_call_is_the_one_triton_makes(
    encoded: collections.Counter[int], meta: Any,
) -> None:
    raw = RawLauncher()
    launcher = cuda_launcher(raw, meta)
    launch, fn = _launch(launcher)
    w, s, y = _weight()
    xs = [_x() for _ in range(5)]
    for x in xs:
        launch(GRID, w, x, s, y, 16)
    assert launch.descriptor_fallback == "" and launch.bound == 1
    assert len(fn.slow) == 1 and len(raw.calls) == 4  # the first call went through kernel[grid]
    assert encoded[id(w)] == 1 and encoded[id(s)] == 1  # when bound, from the first call's arguments
    assert [encoded[id(x)] for x in xs] == [0, 1, 1, 1, 1]
    direct = list(raw.calls)
    for x, call in zip(xs[1:], direct, strict=True):
        want = _tritons_call(launcher, raw, (w, x, s, y, 16))
        assert len(call) == len(want) and call == want
        assert call[:13] == (*GRID, STREAM, 4242, False, True, None, None, (4, 1, 1024), None, None, None)


def test_profiler_hooks_take_tritons_launcher(encoded: collections.Counter[int]) -> None:
    raw = RawLauncher()
    launcher = cuda_launcher(raw, TMA_META)
    launch, _ = _launch(launcher)
    w, s, y = _weight()
    launch(GRID, w, _x(), s, y, 16)
    seen: list[Any] = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        x = _x()
        launch(GRID, w, x, s, y, 16)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    assert encoded[id(w)] == 2 and encoded[id(s)] == 2  # bound, then per call by Triton's wrapper
    (call,) = raw.calls
    assert call[10] == {"grid": GRID, "stream": STREAM} and call[11] is knobs.runtime.launch_enter_hook
    assert call[13:] == _tritons_call(launcher, raw, (w, x, s, y, 16))[13:]


def test_fixed_pointers_reach_the_direct_launch_as_addresses(encoded: collections.Counter[int]) -> None:
    """Both kinds of fixed position on one launch: the descriptors encoded once and the
    fixed tensor passed as its address, each call otherwise the one Triton makes."""
    raw = RawLauncher()
    launcher = cuda_launcher(raw, TMA_META)
    fn = DescriptorJIT(launcher)
    launch = Launch(fn, constexprs={"BLOCK": 64}, varying=(4,), fixed_descriptors=FIXED, fixed_pointers=(3,),
                    device=torch.device("cuda", 0))
    w, s, y = _weight()
    launch(GRID, w, _x(), s, y, 16)  # the first call: kernel[grid], with the tensor
    assert fn.slow[0][5] is y and not raw.calls
    x = _x()
    launch(GRID, w, x, s, y, 16)
    assert launch.descriptor_fallback == "" and encoded[id(w)] == 1
    (call,) = raw.calls
    want = _tritons_call(launcher, raw, (w, x, s, y.data_ptr(), 16))
    assert call == want and y.data_ptr() in call and not any(a is y for a in call)
    other = torch.empty_like(y)
    launch(GRID, w, x, s, other, 16)  # another output: passed as given
    call = raw.calls.pop()
    assert call == _tritons_call(launcher, raw, (w, x, s, other, 16)) and call[-3] is other


@pytest.mark.parametrize("which", ["global", "profile"])
def test_a_kernel_with_scratch_takes_tritons_launcher(encoded: collections.Counter[int], which: str) -> None:
    raw = RawLauncher()
    launcher = cuda_launcher(raw, TMA_META, **{f"{which}_scratch": 64})
    launch, _ = _launch(launcher)
    allocated: list[torch.Tensor] = []

    def alloc(size: int, align: int, stream: int) -> torch.Tensor:
        allocated.append(torch.empty(size, dtype=torch.int8))
        return allocated[-1]

    if which == "global":
        token = _allocation._allocator.set(alloc)
    else:
        before = _allocation._profile_allocator.get()
        _allocation._profile_allocator.set(alloc)
    try:
        w, s, y = _weight()
        for _ in range(3):
            launch(GRID, w, _x(), s, y, 16)
    finally:
        if which == "global":
            _allocation._allocator.reset(token)
        else:
            _allocation._profile_allocator.set(before)
    assert "scratch" in launch.descriptor_fallback
    assert encoded[id(w)] == 2 and len(raw.calls) == 2  # per call, through Triton's wrapper
    assert all(call[7 if which == "global" else 8] is buf for call, buf in zip(raw.calls, allocated, strict=True))


def test_a_launcher_of_another_shape_takes_tritons_launcher_and_says_why(encoded: collections.Counter[int]) -> None:
    raw = RawLauncher()
    wrapped = driver.wrap_handle_tensordesc(raw, SIGNATURE, TMA_META)

    def launch_all(*args: Any) -> None:  # a wrapper of another shape around Triton's
        wrapped(*args)

    launcher = cuda_launcher(raw, TMA_META, wrapper=launch_all)
    launch, _ = _launch(launcher)
    w, s, y = _weight()
    for _ in range(3):
        launch(GRID, w, _x(), s, y, 16)
    assert "not wrap_handle_tensordesc's closure" in launch.descriptor_fallback and launch.bound == 1
    assert encoded[id(w)] == 2 and len(raw.calls) == 2


def test_an_encoder_that_takes_other_arguments_takes_tritons_launcher_and_says_why(
        encoded: collections.Counter[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton 3.8's ``make_tensordesc_arg`` takes a third argument: encoding with two
    would raise at the first call, so the launch keeps Triton's launcher."""
    from quantcore.triton import direct_launch as direct_mod

    def three(arg: Any, meta: Any, cache: Any) -> list[Any]:  # pragma: no cover - never called
        raise AssertionError("an encoder of another signature is never called")

    other = type(driver)("another_driver")
    other.__dict__.update(vars(driver))
    other.make_tensordesc_arg = three  # type: ignore[attr-defined]
    monkeypatch.setattr(direct_mod, "_driver", lambda: other)
    raw = RawLauncher()
    launch, _ = _launch(cuda_launcher(raw, TMA_META))
    w, s, y = _weight()
    for _ in range(3):
        launch(GRID, w, _x(), s, y, 16)
    assert "make_tensordesc_arg does not take (descriptor, metadata)" in launch.descriptor_fallback
    # as with every fallback: the calls after the binding one through Triton's wrapper, which encodes each time
    assert launch.bound == 1 and len(raw.calls) == 2 and encoded[id(w)] == 2


def test_the_encoder_check_reads_the_signature() -> None:
    from quantcore.triton.direct_launch import _takes_two

    def two(arg: Any, meta: Any) -> None: ...
    def optional_third(arg: Any, meta: Any, cache: Any = None) -> None: ...
    def three(arg: Any, meta: Any, cache: Any) -> None: ...
    def spread(*args: Any) -> None: ...

    assert _takes_two(two) and _takes_two(optional_third) and _takes_two(spread)
    assert not _takes_two(three) and not _takes_two(None) and not _takes_two(lambda arg: None)


def test_a_launcher_that_is_no_cuda_launcher_is_launched_as_before() -> None:
    calls: list[tuple[Any, ...]] = []
    launch, _ = _launch(lambda *args: calls.append(args))
    w, s, y = _weight()
    x = _x()
    for _ in range(2):
        launch(GRID, w, x, s, y, 16)
    assert "not Triton's CudaLauncher" in launch.descriptor_fallback
    assert calls == [(*GRID, STREAM, 4242, (4, 1, 1024), None, None, None, w, x, s, y, 16, 64)]


def test_a_fixed_position_that_is_no_descriptor_of_the_kernel_is_refused_with_a_reason(
    encoded: collections.Counter[int],
) -> None:
    raw = RawLauncher()
    launch, _ = _launch(cuda_launcher(raw, TMA_META), fixed=(0, 3))
    w, s, y = _weight()
    for _ in range(2):
        launch(GRID, w, _x(), s, y, 16)
    assert "[3] are not tensor descriptors" in launch.descriptor_fallback
    assert encoded[id(w)] == 1 and len(raw.calls) == 1


def test_another_object_at_a_fixed_position_is_encoded_for_its_call(encoded: collections.Counter[int]) -> None:
    raw = RawLauncher()
    launcher = cuda_launcher(raw, TMA_META)
    launch, _ = _launch(launcher)
    w, s, y = _weight()
    launch(GRID, w, _x(), s, y, 16)
    other, _, _ = _weight()
    x = _x()
    launch(GRID, other, x, s, y, 16)
    assert encoded[id(other)] == 1 and encoded[id(s)] == 2  # Triton's wrapper, for this call
    assert raw.calls[0] == _tritons_call(launcher, raw, (other, x, s, y, 16))
    before = dict(encoded)
    launch(GRID, w, x, s, y, 16)
    assert encoded[id(w)] == before[id(w)] == 1 and encoded[id(s)] == before[id(s)]  # the direct launch again
    assert encoded[id(x)] == before[id(x)] + 1


def test_the_switch_binds_with_tritons_launcher(encoded: collections.Counter[int],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_mod, "ENCODE_FIXED_DESCRIPTORS_ONCE", False)
    raw = RawLauncher()
    launch, _ = _launch(cuda_launcher(raw, TMA_META))
    w, s, y = _weight()
    for _ in range(3):
        launch(GRID, w, _x(), s, y, 16)
    assert launch.descriptor_fallback.startswith("switched off") and encoded[id(w)] == 2


def test_the_bound_launch_keeps_the_encoded_descriptors_alive(encoded: collections.Counter[int]) -> None:
    raw = RawLauncher()
    launch, fn = _launch(cuda_launcher(raw, TMA_META))
    w, s, y = _weight()
    launch(GRID, w, _x(), s, y, 16)
    kept = weakref.ref(w), weakref.ref(w.base)
    fn.slow.clear()  # the fake compiler's record of the first call holds them too
    del w
    gc.collect()
    assert all(ref() is not None for ref in kept)  # the CUtensorMap holds w's address
    del launch
    gc.collect()
    assert all(ref() is None for ref in kept)


def test_fixed_descriptor_positions_are_checked_when_the_launch_is_made() -> None:
    fn = DescriptorJIT(None)
    for fixed in ((5,), (4,)):  # beyond the runtime arguments; a varying one
        with pytest.raises(TypeError, match="fixed descriptor positions"):
            Launch(fn, constexprs={"BLOCK": 64}, varying=(4,), fixed_descriptors=fixed, device=torch.device("cuda", 0))


def test_a_per_call_descriptor_is_encoded_again_only_when_what_it_encodes_differs(
    encoded: collections.Counter[int],
) -> None:
    """The last encoding of x's descriptor is reused for a descriptor of the same base
    address, shape, strides, padding and dtype (the caching allocator's block handed back),
    and encoded anew on any difference; each call hands the C launcher what Triton's
    wrapper would."""
    raw = RawLauncher()
    launcher = cuda_launcher(raw, TMA_META)
    launch, _ = _launch(launcher)
    w, s, y = _weight()
    launch(GRID, w, _x(), s, y, 16)  # the first call: kernel[grid]
    block = torch.randn(32, 128).bfloat16()

    def over(m: int = 16, padding: str = "zero", base: torch.Tensor = block, row: int = 128) -> Any:
        return TensorDescriptor(base, [4, m, 32], [32, row, 1], [4, 16, 32], _layout(3), padding)

    same = [over() for _ in range(3)]  # three objects, one encoding
    others = [over(m=8), over(padding="nan"), over(base=block.view(torch.float16)),
              over(base=block[1:].clone()), over(row=256, m=8), over()]
    encodings = []
    for x in same + others:
        launch(GRID, w, x, s, y, 16)
        encodings.append(encoded[id(x)])
        call = raw.calls.pop()
        assert call == _tritons_call(launcher, raw, (w, x, s, y, 16))
    assert encodings[:3] == [1, 0, 0]
    assert encodings[3:] == [1, 1, 1, 1, 1, 1]  # each differs from the call before it


def test_the_reused_encoding_keeps_no_tensor_alive(encoded: collections.Counter[int]) -> None:
    """Only the address is kept: the activation's block can go back to the allocator."""
    raw = RawLauncher()
    launch, fn = _launch(cuda_launcher(raw, TMA_META))
    w, s, y = _weight()
    launch(GRID, w, _x(), s, y, 16)
    x = _x()
    launch(GRID, w, x, s, y, 16)
    kept = weakref.ref(x.base)
    fn.slow.clear()
    del x
    gc.collect()
    assert kept() is None
