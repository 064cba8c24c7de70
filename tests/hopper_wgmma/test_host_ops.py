"""What an eager call of ``hopper_wgmma`` asks of torch besides its launch — each op costs
the host microseconds on a GPU, where a decode step's calls should cost about a launch
each — counted as the aten ops that reach the dispatcher, with the launch recorded
instead of run (no GPU). Per call, after a bucket's first:

* a module (QuantLinear) called with a model's ``[B, T, K]`` or a flat ``[M, K]``: the
  output, made in its final shape, and the launch — no reshape of x, no view of y;
* act-order: the permutation of x too;
* a split-K plan: nothing more (its workspace and counters are the stream's kept ones,
  as on CUDA; a CPU call makes its own);
* a small-M Triton plan: the output and the launch;

and the bucket is found in the prepared state without the weight's launch state, while
a weight whose tensors were replaced is bound again, and the checks of x still refuse."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

from quantcore.backends.hopper_wgmma import launch, small_m
from quantcore.backends.hopper_wgmma.kernel import HopperWgmmaGPTQ
from quantcore.backends.hopper_wgmma.plans import Plan, TritonPlan
from quantcore.errors import KernelInputError
from quantcore.formats.gptq import GPTQ
from quantcore.nn.linear import QuantLinear
from tests.aten_ops import ops_of_call
from tests.launch_recorder import Recorder, record_launches

K, N = 512, 256


def _ops(call: Callable[[], object]) -> Counter[str]:
    return ops_of_call(call)


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    made = record_launches(monkeypatch, launch)
    monkeypatch.setattr(small_m, "Launch", Recorder)
    return made


def _module(fmt: GPTQ, plan: Any, monkeypatch: pytest.MonkeyPatch) -> QuantLinear:
    """A QuantLinear holding hopper_wgmma's prepared state (its requirements name a GPU;
    the launch is recorded here), every call planned ``plan``."""
    monkeypatch.setattr(launch, "plan_of", lambda m, w, device: plan)
    tensors = fmt.quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(4)) * 0.05)
    module = QuantLinear(fmt, tensors, device="cpu", dtype=torch.bfloat16)
    kernel = HopperWgmmaGPTQ(fmt, "cpu")
    module._adopt(kernel, kernel.prepare(tensors, dtype=torch.bfloat16))
    return module


ONE_WG = Plan(wg=1, bm=16, stages=4, split=1)


@pytest.mark.parametrize("shape", [(1, 1, K), (3, K)], ids=["BTK", "MK"])
def test_a_module_call_issues_the_output_and_the_launch(recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch,
                                                         shape: tuple[int, ...]) -> None:
    module = _module(GPTQ(bits=4, group_size=128, sym=False), ONE_WG, monkeypatch)
    x = torch.randn(*shape).bfloat16()
    assert _ops(lambda: module(x)) == Counter({"empty": 1})
    (launched,) = recorded
    assert len(launched.calls) == 2
    y = module(x)
    assert y.shape == (*shape[:-1], N) and y.is_contiguous()
    _, args = launched.calls[-1]
    assert args[5].data_ptr() == y.data_ptr() and args[8] == x.numel() // K  # y written in place, M rows
    assert args[1].base is x  # x's storage read as it is


def test_act_order_adds_the_permutation_and_a_split_takes_the_kept_buffers(recorded: list[Recorder],
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.triton import split_k

    monkeypatch.setattr(split_k, "keeps_buffers", lambda device: True)  # CUDA's rule
    module = _module(GPTQ(bits=4, group_size=32, desc_act=True), Plan(wg=1, bm=16, stages=4, split=2), monkeypatch)
    assert module.prepared.ret_idx is not None
    x = torch.randn(1, 1, K).bfloat16()
    assert _ops(lambda: module(x)) == Counter({"index_select": 1, "empty": 1})
    monkeypatch.setattr(split_k, "keeps_buffers", lambda device: False)  # a CPU's own rule
    fresh = _module(GPTQ(bits=4, group_size=32, desc_act=True), Plan(wg=1, bm=16, stages=4, split=2), monkeypatch)
    assert _ops(lambda: fresh(x)) == Counter({"index_select": 1, "empty": 2, "zeros": 1})


def test_a_small_m_triton_plan_issues_the_output_and_the_launch(recorded: list[Recorder],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(GPTQ(bits=4, group_size=128), TritonPlan("gemv", block_n=64), monkeypatch)
    x = torch.randn(1, 1, K).bfloat16()
    assert _ops(lambda: module(x)) == Counter({"empty": 1})
    (launched,) = recorded
    _, args = launched.calls[-1]
    assert args[0] is x and args[9] == 1


def test_a_non_contiguous_x_is_launched_as_its_contiguous_copy(recorded: list[Recorder],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(GPTQ(bits=4, group_size=128), ONE_WG, monkeypatch)
    x = torch.randn(1, 2, 2 * K).bfloat16()[..., ::2]
    y = module(x)
    assert y.shape == (1, 2, N)
    _, args = recorded[0].calls[-1]
    copy = args[1].base
    assert copy.is_contiguous() and torch.equal(copy.view(-1, K), x.reshape(-1, K))


def test_a_call_finds_its_bucket_without_the_launch_state_and_a_replaced_weight_is_bound_again(
        recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(GPTQ(bits=4, group_size=128), ONE_WG, monkeypatch)
    w = module.prepared
    x = torch.randn(1, K).bfloat16()
    module(x)
    looked: list[Any] = []
    real = launch.launch_state
    monkeypatch.setattr(launch, "launch_state", lambda owner: looked.append(owner) or real(owner))
    module(x)
    assert looked == [] and len(recorded) == 1
    w.scales = w.scales.clone()  # what a load into the module's buffers does to the state
    module(x)
    assert looked == [w.qweight] and len(recorded) == 2
    assert recorded[1].calls[-1][1][2] is not recorded[0].calls[-1][1][2]  # the new scales' descriptor


def test_the_buckets_remembered_in_the_state_are_bounded(recorded: list[Recorder],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(GPTQ(bits=4, group_size=128), ONE_WG, monkeypatch)
    monkeypatch.setattr(launch, "MAX_RUNS", 4)
    for m in range(1, 12):
        module(torch.randn(m, K).bfloat16())
    remembered = [k for k in module.prepared.runtime if len(k) == 3]
    assert 1 <= len(remembered) <= 4 and (torch.bfloat16, torch.device("cpu"), 11) in remembered


@pytest.mark.parametrize(("x", "named"), [
    (torch.randn(1, 1, K + 32).bfloat16(), str(K)),
    (torch.randn(1, 1, K), "float32"),
    (torch.randn(1, 1, K, dtype=torch.bfloat16, device="meta"), "meta"),
], ids=["K", "dtype", "device"])
def test_the_checks_of_x_refuse_naming_what_came(recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch,
                                                  x: torch.Tensor, named: str) -> None:
    module = _module(GPTQ(bits=4, group_size=128), ONE_WG, monkeypatch)
    with pytest.raises(KernelInputError, match=named):
        module.kernel(x, module.prepared)
    assert not recorded or not recorded[0].calls


def test_the_plain_path_of_an_explicit_plan_takes_any_rank(recorded: list[Recorder],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(GPTQ(bits=4, group_size=128), ONE_WG, monkeypatch)
    launched: list[tuple[Any, tuple[Any, ...]]] = []

    class Kernel:
        def __getitem__(self, grid: Any) -> Callable[..., None]:
            return lambda *args, **const: launched.append((grid, args))

    monkeypatch.setattr(launch, "wgmma_kernel", Kernel())
    x = torch.randn(2, 3, K).bfloat16()
    y = launch.linear(x, module.prepared, ONE_WG)
    (_, args), = launched
    assert y.shape == (2, 3, N) and args[5].shape == (6, N) and args[5].data_ptr() == y.data_ptr()
    assert list(args[1].shape) == [K // 32, 6, 32] and args[8] == 6 and not recorded
