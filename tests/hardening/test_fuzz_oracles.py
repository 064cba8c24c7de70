"""The fuzz oracles' own rules, on hand-made outputs: an oracle that passes a wrong result,
or fails a right one, makes the fuzz suites prove nothing.

The MoE contract for an expert id outside ``[0, E)`` that a call takes (a kernel that does
not read the ids on the host, as on CUDA): that route's row is NaN, every other row right."""

from __future__ import annotations

import pytest
import torch

from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.ops.moe import moe_gemm_reference
from quantcore.ops.moe.harness import GoldenExperts
from tests.hardening.fuzz.oracles import MoEOracle

E, K, N, T = 2, 128, 64, 3


def _case(weighted: bool) -> tuple[TRTLLMMoE, dict[str, torch.Tensor], dict, torch.Tensor, torch.Tensor]:
    """The format, its tensors, inputs whose route (1, 0) names expert E, that route's mask,
    and a right output: the reference with the stray route sent to expert 0, NaN there."""
    gen = torch.Generator().manual_seed(0)
    fmt = TRTLLMMoE(group_size=64, sym=False)
    tensors = dict(fmt.quantize(torch.randn(E, K, N, generator=gen) * 0.05, generator=gen))
    x = torch.randn(T, K, generator=gen).bfloat16()
    ids = torch.tensor([[0, 1], [E, 0], [1, 0]], dtype=torch.int32)
    weights = torch.softmax(torch.randn(T, 2, generator=gen), dim=-1) if weighted else None
    stray = ids >= E
    fixed = torch.where(stray, 0, ids)
    out = moe_gemm_reference(x, fixed, GoldenExperts(fmt, tensors), weights).to(torch.bfloat16).clone()
    rows = stray.any(dim=1) if weighted else stray
    out[rows] = float("nan")
    return fmt, tensors, {"x": x, "topk_ids": ids, "topk_weights": weights}, rows, out


@pytest.mark.parametrize("weighted", [False, True], ids=["per-route", "weighted"])
def test_a_stray_expert_id_must_give_its_route_a_nan_row(weighted: bool) -> None:
    oracle = MoEOracle()
    fmt, tensors, inputs, rows, out = _case(weighted)
    assert oracle.judge(out, fmt, tensors, inputs) is None

    made_up = out.clone()
    made_up[rows] = 0.0
    assert "finite output element" in (oracle.judge(made_up, fmt, tensors, inputs) or "")

    wrong = out.clone()
    wrong[~rows] *= 1.5
    assert oracle.judge(wrong, fmt, tensors, inputs) is not None

    lost = out.clone()
    lost[~rows] = float("nan")
    assert "non-finite" in (oracle.judge(lost, fmt, tensors, inputs) or "")
