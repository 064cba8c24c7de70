"""InputRotation (quantcore/kernels/turboquant/rotation.py): every pass's rotation of x in
one GEMM, laid out [M, G, P, d], each pass's copy the rotation ``rotate_input`` computes;
its concatenated right-hand side made once and noticed stale after an in-place change."""

from __future__ import annotations

import pytest
import torch

from quantcore.formats.turboquant import TurboQuant
from quantcore.kernels.turboquant.base import rotate_input
from quantcore.kernels.turboquant.rotation import InputRotation


def _rotations(fmt: TurboQuant, k: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    t = fmt.quantize(torch.randn(8, k, generator=gen), generator=gen)
    return [t[prefix + "rotation"] for prefix in fmt.passes]


@pytest.mark.parametrize("fmt", [TurboQuant(group_size=32), TurboQuant(group_size=32, residual=True),
                                 TurboQuant(group_size=32, rotation_per_group=True),
                                 TurboQuant(group_size=32, rotation_per_group=True, residual=True)],
                         ids=lambda f: f.slug)
def test_each_pass_copy_is_the_pass_rotation(fmt: TurboQuant) -> None:
    k, m, d = 128, 5, 32
    rotations = _rotations(fmt, k, 0)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
    got = InputRotation(rotations)(x)
    p = len(rotations)
    assert got.shape == (m * k // d, p * d) and got.is_contiguous()
    for i, rotation in enumerate(rotations):
        want = rotate_input(x, rotation).view(m, k // d, d)
        torch.testing.assert_close(got.view(m, k // d, p, d)[:, :, i, :], want, rtol=1e-6, atol=1e-6)


def test_activation_cast_to_the_rotation_dtype() -> None:
    rotations = [r.to(torch.bfloat16) for r in _rotations(TurboQuant(group_size=32, residual=True), 64, 2)]
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3))
    got = InputRotation(rotations)(x)
    assert got.dtype == torch.bfloat16
    want = rotate_input(x, rotations[1]).view(3, 2, 32)
    torch.testing.assert_close(got.view(3, 2, 2, 32)[:, :, 1, :], want)


def test_concatenated_rotations_are_stale_after_an_in_place_change() -> None:
    rotations = [r.clone() for r in _rotations(TurboQuant(group_size=32, residual=True), 64, 4)]
    rotation = InputRotation(rotations)
    assert rotation.current()
    rotations[1].copy_(_rotations(TurboQuant(group_size=32, residual=True), 64, 5)[1])  # a state dict loaded in place
    assert not rotation.current()
    single = InputRotation(rotations[:1])  # its right-hand side is the rotation itself: never stale
    rotations[0].mul_(1.0)
    assert single.current()


def test_more_than_two_rotations_refused() -> None:
    rotations = _rotations(TurboQuant(group_size=32), 64, 6)
    with pytest.raises(ValueError, match="one or two rotations"):
        InputRotation(rotations * 3)
