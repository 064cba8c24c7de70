"""The quantizer: distortion against the paper's figures, the residual pass, edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from quantcore.errors import TensorFormatError
from quantcore.formats.turboquant import TurboQuant
from quantcore.formats.turboquant.codebook import gaussian_distortion, lloyd_max_gaussian
from quantcore.formats.turboquant.rotation import random_rotation

PAPER_BOUND_4BIT = math.sqrt(3) * math.pi / 2 * 4.0**-4  # ≈ 0.0106


def relative_mse(fmt: TurboQuant, w: torch.Tensor, seed: int = 0) -> float:
    t = fmt.quantize(w, generator=torch.Generator().manual_seed(seed))
    err = fmt.dequantize(t) - w.double()
    return (err.pow(2).sum() / w.double().pow(2).sum()).item()


@pytest.mark.parametrize("dist", ["gaussian", "student_t", "outlier_columns"])
def test_four_bit_distortion_matches_the_gaussian_lloyd_max_whatever_the_weights(dist: str) -> None:
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(256, 1024, generator=gen)
    if dist == "student_t":
        w = torch.distributions.StudentT(3.0).sample((256, 1024))
    elif dist == "outlier_columns":
        w[:, ::97] *= 30.0
    mse = relative_mse(TurboQuant(bits=4, group_size=128), w)
    # After the rotation every coordinate is ~N(0, 1/d): the Gaussian quantizer's 0.0095
    # (a little less at d = 128, where the Beta law has lighter tails), under the bound.
    assert 0.0085 < mse < gaussian_distortion(lloyd_max_gaussian(16)) + 5e-4
    assert mse < PAPER_BOUND_4BIT


def test_residual_pass_squares_the_error() -> None:
    w = torch.randn(256, 1024, generator=torch.Generator().manual_seed(2))
    one = relative_mse(TurboQuant(), w)
    two = relative_mse(TurboQuant(residual=True), w)
    assert two < 1.5 * one * one  # the second pass quantizes what the first left, ≈ D²
    assert two < 1.2e-4


def test_per_group_rotations_are_independent_and_orthogonal() -> None:
    fmt = TurboQuant(group_size=64, rotation_per_group=True)
    t = fmt.quantize(torch.randn(32, 256), generator=torch.Generator().manual_seed(3))
    r = t["rotation"].double()
    assert r.shape == (4, 64, 64)
    assert torch.allclose(r @ r.transpose(1, 2), torch.eye(64, dtype=torch.float64).expand(4, 64, 64), atol=1e-5)
    assert not torch.allclose(r[0], r[1])


def test_haar_rotation_has_no_sign_bias() -> None:
    q = random_rotation(8, 4000, generator=torch.Generator().manual_seed(4))
    # QR's convention would make the diagonal of R positive and bias Q's diagonal;
    # Haar-distributed Q has E[Q_ii] = 0.
    assert q.diagonal(dim1=1, dim2=2).mean().abs() < 0.02


def test_zero_slices_stay_zero_and_bits_below_four_work() -> None:
    w = torch.randn(8, 128)
    w[3] = 0
    for fmt in (TurboQuant(group_size=64), TurboQuant(bits=2, group_size=64, residual=True)):
        deq = fmt.dequantize(fmt.quantize(w))
        assert torch.equal(deq[3], torch.zeros(128, dtype=torch.float64))


def test_norms_beyond_float16_are_refused_and_fp32_norms_take_them() -> None:
    w = torch.randn(4, 128, generator=torch.Generator().manual_seed(0))  # seeded: the bound is tight
    w[2] *= 1e5
    with pytest.raises(TensorFormatError, match="row 2, group 0"):
        TurboQuant().quantize(w)
    assert relative_mse(TurboQuant(norm_dtype=torch.float32), w) < 0.011


@pytest.mark.parametrize(
    ("weight", "message"),
    [(torch.randn(4, 100), "multiple of group_size"), (torch.randn(128), "2-D"),
     (torch.full((2, 128), float("nan")), "NaN")],
)
def test_bad_weights(weight: torch.Tensor, message: str) -> None:
    with pytest.raises(TensorFormatError, match=message):
        TurboQuant().quantize(weight)
