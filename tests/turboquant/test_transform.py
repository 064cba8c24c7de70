"""The per-pass transform into kernel layout: split halves by hand, exact round trips."""

from __future__ import annotations

import math

import pytest
import torch

from quantcore.formats.turboquant import TurboQuant
from quantcore.kernels.turboquant.base import pass_tensors, rotate_input
from quantcore.transforms.turboquant_passes import TurboQuantPassTransform, split_halves_order


def test_split_halves_order_by_hand() -> None:
    assert split_halves_order(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]


@pytest.mark.parametrize("norm_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("split", [False, True])
def test_round_trip_is_bit_exact(norm_dtype: torch.dtype, split: bool) -> None:
    fmt = TurboQuant(group_size=64, rotation_per_group=True, norm_dtype=norm_dtype)
    t = pass_tensors(fmt.quantize(torch.randn(16, 256) * 3), "")
    tr = TurboQuantPassTransform(fmt, split_halves=split)
    back = tr.invert(tr.apply(t))
    for name in t:
        assert torch.equal(back[name], t[name]), name


def test_split_halves_put_even_then_odd_coordinates_of_each_group() -> None:
    fmt = TurboQuant(group_size=8)
    t = pass_tensors(fmt.quantize(torch.randn(4, 16), generator=torch.Generator().manual_seed(0)), "")
    x = torch.randn(3, 16)
    natural_rhs = TurboQuantPassTransform(fmt, split_halves=False).apply(t).rotation
    split_rhs = TurboQuantPassTransform(fmt, split_halves=True).apply(t).rotation
    # The layout is exact: the split rotation is the natural one with its columns reordered.
    assert torch.equal(split_rhs, natural_rhs[:, :, split_halves_order(8)])
    # Through the GEMM the same holds up to rounding: BLAS may block permuted columns
    # differently, so the products need not agree to the last bit.
    natural = rotate_input(x, natural_rhs)
    split = rotate_input(x, split_rhs)
    expected = natural.view(3, 2, 8)[:, :, split_halves_order(8)].reshape(3, 16)
    torch.testing.assert_close(split, expected, rtol=1e-6, atol=1e-6)
    # and the natural order is x_g Π_gᵀ
    torch.testing.assert_close(natural[:, :8], x[:, :8] @ t["rotation"][0].T)


def test_scales_are_norms_over_root_d() -> None:
    fmt = TurboQuant(group_size=64)
    t = pass_tensors(fmt.quantize(torch.randn(4, 128)), "")
    scales = TurboQuantPassTransform(fmt, split_halves=False).apply(t).scales
    assert scales.dtype == torch.float32
    assert torch.allclose(scales, t["norms"].float() / math.sqrt(64))
