"""The scalar codebook of TurboQuant: the Lloyd-Max quantizer of N(0, 1).

After a random rotation every coordinate of a unit vector in R^d follows a Beta law
that tends to N(0, 1/d); TurboQuant scales the rotated coordinates by √d and rounds each
to the nearest of 2^b centroids optimal for N(0, 1) (docs/formats/turboquant.md, step 3).

The centroids come from Lloyd's iteration on the Gaussian density, in float64 with the
closed forms of the Gaussian's partial moments, so nothing here depends on sampling:

* boundaries are the midpoints of neighbouring centroids (nearest-neighbour rule);
* each centroid is the conditional mean of its cell,
  ``E[X | a < X ≤ b] = (φ(a) − φ(b)) / (Φ(b) − Φ(a))``.

``CLASSICAL_LLOYD_MAX_16`` holds the published 16-level values the result is checked
against (Max 1960; the spec quotes them to four decimals).
"""

from __future__ import annotations

import functools
import itertools
import math

import torch

__all__ = [
    "CLASSICAL_LLOYD_MAX_16",
    "codebook_tensor",
    "gaussian_distortion",
    "lloyd_max_gaussian",
]

#: Positive half of the classical 16-level Lloyd-Max quantizer for N(0, 1); the
#: negative half mirrors it.
CLASSICAL_LLOYD_MAX_16 = (0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0690, 2.7326)

_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _pdf(x: float) -> float:
    return 0.0 if math.isinf(x) else _INV_SQRT_2PI * math.exp(-0.5 * x * x)


def _cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / _SQRT2))


def _boundaries(centroids: list[float]) -> list[float]:
    return [-math.inf, *((a + b) / 2 for a, b in itertools.pairwise(centroids)), math.inf]


@functools.cache
def lloyd_max_gaussian(levels: int, *, tol: float = 1e-13, max_iter: int = 100_000) -> tuple[float, ...]:
    """Centroids (ascending) of the ``levels``-point Lloyd-Max quantizer of N(0, 1)."""
    if levels < 2:
        raise ValueError(f"levels: expected at least 2, got {levels}")
    # Start from the cell means of equal-probability cells: already close, and symmetric.
    c = [math.sqrt(2.0) * _erfinv(2.0 * (i + 0.5) / levels - 1.0) for i in range(levels)]
    for _ in range(max_iter):
        t = _boundaries(c)
        new = []
        for a, b in itertools.pairwise(t):
            mass = _cdf(b) - _cdf(a)
            new.append((_pdf(a) - _pdf(b)) / mass)
        moved = max(abs(x - y) for x, y in zip(new, c, strict=False))
        c = new
        if moved < tol:
            break
    else:  # pragma: no cover - Lloyd's iteration converges for the Gaussian
        raise RuntimeError(f"Lloyd iteration for {levels} levels did not converge")
    # Symmetrise exactly: the density is even, so the optimum is too.
    half = levels // 2
    sym = [(c[levels - 1 - i] - c[i]) / 2 for i in range(half)]
    return tuple([-v for v in sym] + ([0.0] if levels % 2 else []) + sym[::-1])


def gaussian_distortion(centroids: tuple[float, ...]) -> float:
    """E[(X − Q(X))²] for X ~ N(0, 1) and nearest-centroid Q, in closed form.

    Uses ∫_a^b (x − c)² φ = (Φ(b) − Φ(a))(1 + c²) − 2c(φ(a) − φ(b)) + (aφ(a) − bφ(b)).
    """
    t = _boundaries(list(centroids))
    total = 0.0
    for c, a, b in zip(centroids, t, t[1:], strict=False):
        mass = _cdf(b) - _cdf(a)
        first = _pdf(a) - _pdf(b)
        a_pdf = 0.0 if math.isinf(a) else a * _pdf(a)
        b_pdf = 0.0 if math.isinf(b) else b * _pdf(b)
        total += mass * (1.0 + c * c) - 2.0 * c * first + (a_pdf - b_pdf)
    return total


def codebook_tensor(bits: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ``2**bits`` centroids as the tensor a checkpoint stores."""
    return torch.tensor(lloyd_max_gaussian(1 << bits), dtype=dtype)


def _erfinv(y: float) -> float:
    """Inverse error function by Newton's method on math.erf (float64, |y| < 1)."""
    x = 0.0
    for _ in range(100):
        step = (math.erf(x) - y) / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
        x -= step
        if abs(step) < 1e-15:
            break
    return x
