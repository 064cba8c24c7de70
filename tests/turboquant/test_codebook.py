"""The Lloyd-Max codebook: computed by Lloyd's iteration, checked against the classics."""

from __future__ import annotations

import itertools
import math

import pytest

from quantcore.formats.turboquant.codebook import (
    CLASSICAL_LLOYD_MAX_16,
    gaussian_distortion,
    lloyd_max_gaussian,
)


def test_sixteen_levels_match_the_classical_table() -> None:
    c = lloyd_max_gaussian(16)
    # The published values are rounded to 4 decimals from Max's (1960) computation.
    for ours, classic in zip(c[8:], CLASSICAL_LLOYD_MAX_16, strict=True):
        assert abs(ours - classic) < 1e-4
    assert all(a == -b for a, b in zip(c, reversed(c), strict=True))


@pytest.mark.parametrize("levels", [2, 4, 8, 16])
def test_lloyd_fixed_point_conditions_hold(levels: int) -> None:
    c = lloyd_max_gaussian(levels)
    assert list(c) == sorted(c)
    bounds = [-math.inf, *((a + b) / 2 for a, b in itertools.pairwise(c)), math.inf]
    pdf = lambda x: 0.0 if math.isinf(x) else math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    for ci, a, b in zip(c, bounds, bounds[1:], strict=False):  # each centroid is its cell's mean
        assert abs(ci - (pdf(a) - pdf(b)) / (cdf(b) - cdf(a))) < 1e-9


@pytest.mark.parametrize(
    ("levels", "expected"),
    # Classical Gaussian Lloyd-Max distortions (Max 1960): 1, 2, 3, 4 bits.
    [(2, 0.3634), (4, 0.1175), (8, 0.03454), (16, 0.009497)],
)
def test_distortion_is_the_classical_one_and_under_the_paper_bound(levels: int, expected: float) -> None:
    d = gaussian_distortion(lloyd_max_gaussian(levels))
    assert abs(d - expected) / expected < 2e-3
    bits = int(math.log2(levels))
    assert d <= math.sqrt(3) * math.pi / 2 * 4.0**-bits  # the paper's bound


def test_distortion_of_two_levels_in_closed_form() -> None:
    # Q(x) = ±sqrt(2/π): distortion 1 − 2/π.
    c = lloyd_max_gaussian(2)
    assert abs(c[1] - math.sqrt(2 / math.pi)) < 1e-12
    assert abs(gaussian_distortion(c) - (1 - 2 / math.pi)) < 1e-12
