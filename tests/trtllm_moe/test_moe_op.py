"""The moe op's golden references and routing checks, on hand-computed examples."""

from __future__ import annotations

import math

import pytest
import torch

from quantcore.errors import KernelInputError
from quantcore.ops import get_op
from quantcore.ops.moe import check_routing, moe_ffn_reference, moe_gemm_reference, swiglu

W = torch.tensor([[[1.0], [2.0]], [[3.0], [4.0]]])  # E = 2, K = 2, N = 1
X = torch.tensor([[1.0, 1.0], [1.0, -1.0]])
IDS = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)


def test_routed_gemm_hand_example() -> None:
    # token 0: x·W0 = 3, x·W1 = 7; token 1: x·W1 = -1, x·W0 = -1
    y = moe_gemm_reference(X, IDS, W)
    assert y.dtype == torch.float64 and y.squeeze(-1).tolist() == [[3.0, 7.0], [-1.0, -1.0]]


def test_weighted_sum_hand_example() -> None:
    weights = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    assert moe_gemm_reference(X, IDS, W, weights).squeeze(-1).tolist() == [6.0, -1.0]


def test_per_route_rows() -> None:
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[2.0, 0.0], [0.0, 0.0]]])  # [T, topk, K]
    assert moe_gemm_reference(x, IDS, W).squeeze(-1).tolist() == [[1.0, 4.0], [6.0, 0.0]]


def test_experts_may_be_given_lazily() -> None:
    calls: list[int] = []

    class Lazy:
        def __getitem__(self, e: int) -> torch.Tensor:
            calls.append(e)
            return W[e]

    assert torch.equal(moe_gemm_reference(X, IDS, Lazy()), moe_gemm_reference(X, IDS, W))
    assert sorted(calls) == [0, 1]


def test_swiglu_is_linear_half_times_silu_of_gate_half() -> None:
    h = torch.tensor([[2.0, 3.0, 0.0, 1.0]], dtype=torch.float64)  # linear [2, 3], gate [0, 1]
    silu1 = 1.0 / (1.0 + math.exp(-1.0))
    assert torch.allclose(swiglu(h), torch.tensor([[0.0, 3.0 * silu1]], dtype=torch.float64))


def test_ffn_reference_composes_the_stages() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=gen)
    ids = torch.tensor([[0, 1], [1, 0], [1, 1]], dtype=torch.int32)
    weights = torch.rand(3, 2, generator=gen)
    w1, w2 = torch.randn(2, 4, 6, generator=gen), torch.randn(2, 3, 4, generator=gen)
    expected = torch.zeros(3, 4, dtype=torch.float64)
    for t in range(3):
        for j in range(2):
            e = int(ids[t, j])
            h = x[t].double() @ w1[e].double()
            expected[t] += weights[t, j] * (swiglu(h) @ w2[e].double())
    assert torch.allclose(moe_ffn_reference(x, ids, weights, w1, w2), expected, rtol=1e-12, atol=1e-12)


def test_op_is_registered() -> None:
    assert get_op("moe").dims == ("T", "E", "topk", "K", "N")


def _check(x: torch.Tensor, ids: object, weights: object = None) -> tuple[int, int]:
    return check_routing(x, ids, weights, num_experts=2, k=2, dtypes=(torch.float32,), device=torch.device("cpu"))  # type: ignore[arg-type]


def test_check_routing_accepts_both_input_shapes() -> None:
    assert _check(X, IDS) == (2, 2)
    assert _check(torch.zeros(2, 2, 2), IDS, torch.ones(2, 2)) == (2, 2)


@pytest.mark.parametrize(
    ("x", "ids", "weights", "match"),
    [
        (X, IDS.float(), None, "topk_ids: expected a 2-D int32/int64"),
        (X, IDS[0], None, "topk_ids: expected a 2-D"),
        (X, IDS + 1, None, r"expert ids in \[0, 2\), got values in \[1, 2\]"),
        (X, IDS - 1, None, r"got values in \[-1, 0\]"),
        (X[:, :1], IDS, None, "x: expected"),
        (X.double(), IDS, None, "x: expected"),
        (X, IDS, torch.ones(2, 3), r"topk_weights: expected a float \(2, 2\)"),
        (X, IDS, torch.ones(2, 2, dtype=torch.int32), "topk_weights"),
    ],
)
def test_check_routing_refuses(x: torch.Tensor, ids: torch.Tensor, weights: object, match: str) -> None:
    with pytest.raises(KernelInputError, match=match):
        _check(x, ids, weights)
