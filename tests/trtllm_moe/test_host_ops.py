"""What an eager call of ``trtllm_moe_triton`` through ``QuantExperts`` asks of torch
besides its launches, counted as the aten ops that reach the dispatcher, with the
launches recorded instead of run and the planning of a stand-in H100 (its shipped tile
table; CUDA ids are not read). Per call, after a bucket's first: the output, and for a
call above ``ONE_LAUNCH_MAX_ROUTES`` (two launches) the schedule's buffer; the module adds
nothing over the kernel."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from quantcore.backends.trtllm_moe import triton_kernel as kernel_mod
from quantcore.backends.trtllm_moe import triton_launch
from quantcore.backends.trtllm_moe.tiles import ONE_LAUNCH_MAX_ROUTES
from quantcore.backends.trtllm_moe.triton_kernel import TritonMoE
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.nn.moe import QuantExperts
from quantcore.probe.card_tables import H100_SXM
from tests.aten_ops import ops_of_call
from tests.launch_recorder import Recorder, record_launches


@pytest.mark.parametrize(("t", "ops"), [
    (1, Counter({"empty": 1})),  # in-kernel routing: the output, one launch
    (16, Counter({"empty": 1})),
    (150, Counter({"empty": 1})),  # scheduled in one launch: the output
    (1100, Counter({"empty": 2})),  # the scheduling kernel first: the output and the schedule's one buffer
])
def test_a_module_call_issues_what_the_kernel_does(monkeypatch: pytest.MonkeyPatch, t: int, ops: Counter[str]) -> None:
    recorded: list[Recorder] = record_launches(monkeypatch, triton_launch)
    monkeypatch.setattr(kernel_mod, "interpreted", lambda: False)
    monkeypatch.setattr(kernel_mod, "_facts", lambda device: (H100_SXM, 132))
    monkeypatch.setattr(kernel_mod, "reads_ids", lambda ids: False)
    fmt = TRTLLMMoE(group_size=64, scale_dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(t)
    tensors = fmt.quantize(torch.randn(8, 128, 128, generator=gen) * 0.05)
    module = QuantExperts(fmt, tensors, device="cpu")
    kernel = TritonMoE(fmt, "cpu")
    module._adopt(kernel, kernel.prepare(tensors, dtype=torch.bfloat16))
    x = torch.randn(t, 128, generator=gen).bfloat16()
    ids = torch.randint(0, 8, (t, 2), generator=gen, dtype=torch.int32)
    assert ops_of_call(lambda: kernel(x, ids, module.prepared)) == ops
    assert ops_of_call(lambda: module(x, ids)) == ops
    launches = 2 if 2 * t > ONE_LAUNCH_MAX_ROUTES else 1
    assert sum(len(r.calls) for r in recorded) == 4 * launches  # every call launched
