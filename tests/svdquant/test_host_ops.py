"""What an eager call of the SVDQuant Triton kernel asks of torch besides its launch —
each op costs the host microseconds on a GPU — counted as the aten ops that reach the
dispatcher, with the launch recorded instead of run (no GPU). Per call, after a bucket's
first: the three outputs, nothing else (the kernel casts their pointers itself), at every M
and in both formats; where row tiles are shared between programs, the partials and tickets
come from kept buffers on CUDA (no allocation per call), looked up once per bucket and
stream; the module adds nothing; the checks of x still refuse."""

from __future__ import annotations

import cProfile
import pstats
from collections import Counter
from collections.abc import Callable

import pytest
import torch

from quantcore.backends.triton_ascend_int4 import TritonAscendInt4
from quantcore.backends.triton_nvfp4 import TritonNVFP4
from quantcore.errors import KernelInputError
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.kernels.svdquant import triton_launch
from quantcore.nn.svdquant import SVDQuantActQuant
from tests.aten_ops import ops_of_call
from tests.gc_held import gc_held
from tests.launch_recorder import Recorder, record_launches

N, R = 128, 16
#: The outputs (qout, oscales, lora), passed to the kernel as they are.
OUTPUTS = Counter({"empty": 3})


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    return record_launches(monkeypatch, triton_launch)


#: M across the buckets of pad_size 256: 1 (its own specialisation), multiples of 16 and
#: not, the first rows of a new bucket.
MS = (1, 16, 128, 256, 257, 512, 1024)


def _module(pad_size: int, fp4: bool = True) -> SVDQuantActQuant:
    """An act-quant module held by the Triton kernel (its launch is recorded here)."""
    fmt = SVDQuantAct(fp4=fp4, pad_size=pad_size)
    gen = torch.Generator().manual_seed(pad_size)
    tensors = {"lora_down": torch.randn(N, R, generator=gen).bfloat16(),
               "smooth": (torch.rand(N, generator=gen) + 0.5).bfloat16()}
    module = SVDQuantActQuant(fmt, tensors, device="cpu")
    kernel = (TritonNVFP4 if fp4 else TritonAscendInt4)(fmt, "cpu")
    module._adopt(kernel, kernel.prepare(tensors, dtype=torch.bfloat16))
    return module


@pytest.mark.parametrize("m", [1, 16])
def test_a_call_issues_its_outputs_and_the_module_adds_nothing(recorded: list[Recorder], m: int) -> None:
    module = _module(pad_size=16)
    x = torch.randn(m, N).bfloat16()
    assert ops_of_call(lambda: module.kernel(x, module.prepared)) == OUTPUTS
    assert ops_of_call(lambda: module(x)) == OUTPUTS
    out = module(x)
    (launched,) = recorded
    _, args = launched.calls[-1]
    assert args[4] is out[0] and args[5] is out[1] and args[6] is out[2]  # the outputs, written in place


def test_shared_row_tiles_take_kept_partials_and_tickets_on_cuda(recorded: list[Recorder],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(3, N).bfloat16()
    module = _module(pad_size=256)  # the interpreter's 128-row tiles: two per padded M, one program each
    assert ops_of_call(lambda: module(x)) == OUTPUTS + Counter({"empty": 1, "zeros": 1})  # off CUDA: a call's own
    monkeypatch.setattr(triton_launch, "keeps_scratch", lambda device: True)  # decided when a bucket is made
    module = _module(pad_size=256)
    assert ops_of_call(lambda: module(x)) == OUTPUTS
    launched = recorded[-1]
    assert launched.calls[-1][1][7] is launched.calls[-2][1][7]  # the same partials, call after call
    assert launched.calls[-1][1][8] is launched.calls[-2][1][8]
    assert not launched.calls[-1][1][8].any()  # tickets zero between calls


@pytest.mark.parametrize("fp4", [True, False], ids=["nvfp4", "int4"])
def test_the_ops_of_a_call_are_the_same_at_every_m(recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch,
                                                    fp4: bool) -> None:
    """Across the buckets (each M's first call makes or binds its own), a call issues the
    outputs and their views, the kernel's and the module's alike, and runs as many Python
    functions (cProfile's count: steady under load, unlike a time) at every M."""
    monkeypatch.setattr(triton_launch, "keeps_scratch", lambda device: True)  # CUDA's kept scratch
    module = _module(pad_size=256, fp4=fp4)
    functions = set()
    for m in MS:
        x = torch.randn(m, N).bfloat16()
        direct, called = (lambda x=x: module.kernel(x, module.prepared)), (lambda x=x: module(x))
        assert ops_of_call(direct) == OUTPUTS, m
        assert ops_of_call(called) == OUTPUTS, m
        with torch.no_grad():
            kernel = _functions_per_call(direct)
            # the module's own: nn.Module's call, its forward and the trace test
            assert _functions_per_call(called) - kernel <= 7, m
        functions.add(kernel)
    assert len(functions) == 1, functions
    # checks, the bucket's lookup, three outputs, two views, the recorded launch
    assert functions.pop() <= 31
    assert {len(launched.calls) > 0 for launched in recorded} == {True}
    assert len(recorded) == 3  # one bound launch per bucket: M_pad 256, 512, 1024


def _functions_per_call(call: Callable[[], object], calls: int = 10) -> float:
    """The Python and built-in functions one call runs (after a warm call): the difference
    of two profiled runs, so the profiler's own calls cancel."""
    call()

    def counted(n: int) -> int:
        profile = cProfile.Profile()
        profile.runcall(lambda: [call() for _ in range(n)])
        return sum(v[1] for v in pstats.Stats(profile).stats.values())  # type: ignore[attr-defined]

    with gc_held():
        return (counted(2 * calls) - counted(calls)) / calls


def test_kept_scratch_is_looked_up_once_per_bucket_and_stream(recorded: list[Recorder],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_launch, "keeps_scratch", lambda device: True)
    looked_up: list[tuple[object, ...]] = []

    def counting(get: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def counted(*args: object, **kwargs: object) -> torch.Tensor:
            looked_up.append(args)
            return get(*args, **kwargs)
        return counted

    for kept in (triton_launch._PARTIALS, triton_launch._TICKETS):
        monkeypatch.setattr(kept, "get", counting(kept.get))
    module = _module(pad_size=256)
    x = torch.randn(3, N).bfloat16()
    for _ in range(4):
        module(x)
    assert len(looked_up) == 2  # partials and tickets, at the bucket's first call
    launched = recorded[-1]
    assert len({id(args[7]) for _, args in launched.calls}) == 1
    assert len({id(args[8]) for _, args in launched.calls}) == 1


def test_a_call_reads_the_stream_once_for_its_kept_scratch_and_its_launch(recorded: list[Recorder],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_launch, "keeps_scratch", lambda device: True)
    streams = iter([7, 7, 8, 7])
    read: list[int] = []
    # decided when a bucket is made, as keeps_scratch: the query of the bucket's device
    monkeypatch.setattr(triton_launch, "current_stream", lambda device: lambda: read.append(next(streams)) or read[-1])
    module = _module(pad_size=256)
    x = torch.randn(3, N).bfloat16()
    for _ in range(4):
        module(x)
    launched = recorded[-1]
    assert read == [7, 7, 8, 7] and launched.streams == read  # one read a call, handed to the launch
    (bucket,) = triton_launch.launch_state(module.prepared.lora_down).values()
    assert sorted(bucket._scratch) == [7, 8]


def test_an_outgrown_kept_buffer_stays_with_the_bucket_that_has_it(recorded: list[Recorder],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A larger bucket grows the kept partials: the outgrown buffer is retired (never freed),
    so a bucket that remembered it launches on it still — large enough, tickets zero."""
    monkeypatch.setattr(triton_launch, "keeps_scratch", lambda device: True)
    monkeypatch.setattr(triton_launch, "_PARTIALS", triton_launch.KeptBuffers(torch.float32, zero=False))
    module = _module(pad_size=256)
    small, large = torch.randn(3, N).bfloat16(), torch.randn(1024, N).bfloat16()
    module(small)
    before = recorded[-1].calls[-1][1][7]
    module(large)  # eight row tiles: more partials
    grown_to = recorded[-1].calls[-1][1][7]
    assert grown_to is not before and grown_to.numel() > before.numel()
    module(small)
    first = recorded[0]
    assert first.calls[-1][1][7] is before and before.numel() >= first.calls[0][1][7].numel()
    assert not first.calls[-1][1][8].any()


def test_scratch_made_for_a_graph_being_captured_is_not_remembered(recorded: list[Recorder],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_launch, "keeps_scratch", lambda device: True)
    module = _module(pad_size=256)
    x = torch.randn(3, N).bfloat16()
    monkeypatch.setattr(triton_launch, "capturing", lambda device: True)
    module(x)
    (bucket,) = triton_launch.launch_state(module.prepared.lora_down).values()
    assert not bucket._scratch
    monkeypatch.setattr(triton_launch, "capturing", lambda device: False)
    module(x)
    assert len(bucket._scratch) == 1


@pytest.mark.parametrize(("x", "named"), [
    (torch.randn(2, N + 16).bfloat16(), str(N)),
    (torch.randn(2, N), "float32"),
    (torch.empty(2, N, dtype=torch.bfloat16, device="meta"), "meta"),
    (torch.randn(2, 1, N).bfloat16(), r"\(2, 1, 128\)"),
], ids=["N", "dtype", "device", "rank"])
def test_the_checks_of_x_refuse_naming_what_came(recorded: list[Recorder], x: torch.Tensor, named: str) -> None:
    module = _module(pad_size=16)
    with pytest.raises(KernelInputError, match=named):
        module.kernel(x, module.prepared)
    assert not recorded or not recorded[0].calls
