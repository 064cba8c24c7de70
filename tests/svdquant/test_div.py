"""The compiled kernel divides the block max by 6 (NVFP4 scale) and 7 (INT4 scale) without
a division: ``q = a · fl(1/b)``, ``r = fma(q, −b, a)``, ``q + r · fl(1/b)`` rounded once
(Markstein). Here the arithmetic itself, in numpy with the fmas emulated exactly in
float64, against IEEE division, on every exponent of the range that matters with mantissas
on and around the quotient's rounding boundaries (the full sweep over every float32 ≥ 2⁻¹²⁰
found no difference; tests/svdquant/test_cuda.py runs the GPU's fused fma over every
float32 the kernel can meet). Below 2⁻¹²⁰ the quotients lie far under every threshold
the kernel compares them with (the smallest e4m3 step, the INT4 scale floor 1e-10)."""

from __future__ import annotations

import numpy as np
import pytest


def markstein(a: np.ndarray, b: float) -> np.ndarray:
    rcp = np.float32(1.0) / np.float32(b)
    q = (a * rcp).astype(np.float32)
    r64 = a.astype(np.float64) - q.astype(np.float64) * b  # exact: one float32 fma
    r = r64.astype(np.float32)
    assert np.array_equal(r.astype(np.float64), r64), "the remainder is not a float32"
    s64 = r.astype(np.float64) * np.float64(rcp) + q.astype(np.float64)
    # a float64 halfway between two float32 would be a double rounding, not the fma's one
    assert not np.any((s64.view(np.uint64) & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28))
    return s64.astype(np.float32)


def _floats() -> np.ndarray:
    gen = np.random.default_rng(0)
    exps = np.arange(127 - 120, 255, dtype=np.uint32)  # biased exponents of 2^-120 .. 2^127
    mant = np.concatenate([np.arange(0, 1 << 12, dtype=np.uint32) << 11,  # every 12-bit prefix
                           gen.integers(0, 1 << 23, 1 << 12, dtype=np.uint32),
                           np.array([0, 1, 2, (1 << 23) - 2, (1 << 23) - 1], dtype=np.uint32)])
    bits = (exps[:, None] << np.uint32(23)) | mant[None, :]
    # and the float32 neighbours of every b·(representable quotient) boundary in the range
    q = gen.integers(0x03000000, 0x7E000000, 1 << 16, dtype=np.uint32).view(np.float32)
    return np.concatenate([bits.ravel().view(np.float32), q * np.float32(6), q * np.float32(7)])


@pytest.mark.parametrize("b", [6.0, 7.0])
def test_markstein_division_is_correctly_rounded(b: float) -> None:
    a = _floats()
    a = a[np.isfinite(a) & (a >= np.float32(2.0**-120))]
    for d in (-1, 0, 1):
        x = (a.view(np.uint32) + np.uint32(d) if d >= 0 else a.view(np.uint32) - np.uint32(1)).view(np.float32)
        x = x[np.isfinite(x)]
        with np.errstate(over="ignore"):
            got, want = markstein(x, b), x / np.float32(b)
        bad = np.nonzero(got.view(np.uint32) != want.view(np.uint32))[0]
        assert not len(bad), f"{len(bad)} differ, e.g. {x[bad[0]]!r}: {got[bad[0]]!r} vs {want[bad[0]]!r}"
