"""What an eager call of the SVDQuant Triton kernel asks of torch besides its launch —
each op costs the host microseconds on a GPU — counted as the aten ops that reach the
dispatcher, with the launch recorded instead of run (no GPU). Per call, after a bucket's
first: the three outputs and the two views of them the kernel writes through; where row
tiles are shared between programs, the partials and tickets come from kept buffers on
CUDA (no allocation per call); the module adds nothing; the checks of x still refuse."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from quantcore.backends.triton_nvfp4 import TritonNVFP4
from quantcore.errors import KernelInputError
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.kernels.svdquant import triton_launch
from quantcore.nn.svdquant import SVDQuantActQuant
from tests.aten_ops import ops_of_call
from tests.launch_recorder import Recorder, record_launches

N, R = 128, 16
#: The outputs (qout, oscales, lora) and qout's and oscales' bit views passed to the kernel.
OUTPUTS = Counter({"empty": 3, "view": 2, "detach": 2})


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    return record_launches(monkeypatch, triton_launch)


def _module(pad_size: int) -> SVDQuantActQuant:
    """An act-quant module held by the Triton kernel (its launch is recorded here)."""
    fmt = SVDQuantAct(fp4=True, pad_size=pad_size)
    gen = torch.Generator().manual_seed(pad_size)
    tensors = {"lora_down": torch.randn(N, R, generator=gen).bfloat16(),
               "smooth": (torch.rand(N, generator=gen) + 0.5).bfloat16()}
    module = SVDQuantActQuant(fmt, tensors, device="cpu")
    kernel = TritonNVFP4(fmt, "cpu")
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
    assert args[4].data_ptr() == out[0].data_ptr() and args[6] is out[2]  # the outputs written in place


def test_shared_row_tiles_take_kept_partials_and_tickets_on_cuda(recorded: list[Recorder],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(pad_size=256)  # the interpreter's 128-row tiles: two per padded M, one program each
    x = torch.randn(3, N).bfloat16()
    assert ops_of_call(lambda: module(x)) == OUTPUTS + Counter({"empty": 1, "zeros": 1})  # off CUDA: a call's own
    monkeypatch.setattr(triton_launch, "keeps_scratch", lambda device: True)
    assert ops_of_call(lambda: module(x)) == OUTPUTS
    (launched,) = recorded
    assert launched.calls[-1][1][7] is launched.calls[-2][1][7]  # the same partials, call after call
    assert launched.calls[-1][1][8] is launched.calls[-2][1][8]
    assert not launched.calls[-1][1][8].any()  # tickets zero between calls


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
