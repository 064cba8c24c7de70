"""The declared cost of triton_int4's dequantize + cuBLAS path (M above 1024): cuBLAS's
multiply after writing the dense weight: both scale with K·N, so its share of the matmul
rate depends on M (and the code width), and grows with it, as the committed suites measured."""

from __future__ import annotations

import pytest
import torch

from quantcore.backends.triton_int4.kernel import DEQUANT_FROM_M, TritonInt4GPTQ
from quantcore.formats.gptq import GPTQ
from quantcore.probe import Capabilities
from quantcore.problem import Problem

H200 = Capabilities(device="cuda:0", device_type="cuda", available=True, name="NVIDIA H200",
                    compute_capability=(9, 0))


def _share(m: int, k: int, n: int, bits: int = 4) -> float:
    problem = Problem.linear(GPTQ(bits=bits, group_size=128, sym=True), M=m, K=k, N=n, dtype=torch.bfloat16)
    return TritonInt4GPTQ.cost(H200, problem).compute


def test_the_dense_weight_write_weighs_less_as_m_grows() -> None:
    shares = [_share(m, 4096, 14336) for m in (2048, 4096, 8192, 32768)]
    assert shares == sorted(shares) and shares[-1] < 0.98


@pytest.mark.parametrize(("k", "n", "low", "high"), [(4096, 14336, 0.86, 0.91), (14336, 4096, 0.86, 0.91)])
def test_the_share_at_m_2048_is_the_measured_one(k: int, n: int, low: float, high: float) -> None:
    # gptq_linear and awq_linear on the H200 and the H100: 0.87–0.91 of the matmul rate there.
    assert low <= _share(2048, k, n) <= high


def test_8_bit_codes_read_more_before_the_multiply() -> None:
    assert _share(2048, 4096, 14336, bits=8) < _share(2048, 4096, 14336, bits=4)


def test_its_fused_tiles_keep_their_own_share_to_the_switch() -> None:
    assert _share(DEQUANT_FROM_M, 4096, 14336) == pytest.approx(0.45)
    assert _share(DEQUANT_FROM_M + 1, 4096, 14336) > 0.7


def test_the_share_does_not_depend_on_the_weights_shape() -> None:
    assert _share(2048, 4096, 14336) == pytest.approx(_share(2048, 4096, 1024))
