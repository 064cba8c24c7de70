"""The vectorised preprocessor against a loop-by-loop rendering of the C++ (cpp_oracle),
byte for byte, and its inverse, for every weight type and the architectures whose
steps differ."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quantcore.backends.trtllm_moe.preprocess import (
    CutlassMixedGemmLayout,
    QuantType,
    layout_details,
    preprocess_weights_for_mixed_gemm,
    unpreprocess_weights_for_mixed_gemm,
)
from quantcore.errors import UnsupportedProblemError

from .cpp_oracle import preprocess as oracle

ARCHS = [(70, False), (75, False), (80, False), (86, False), (89, False), (90, False), (90, True)]
SHAPES = {QuantType.W8_A16: [(1, 64, 32), (2, 128, 96)],
          QuantType.W4_A16: [(1, 64, 64), (2, 128, 128)],
          QuantType.W4_AFP8: [(1, 128, 64), (2, 256, 64)]}


def _random(shape: tuple[int, int, int], bits: int, seed: int) -> torch.Tensor:
    e, k, n = shape
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, (e, k, n * bits // 8), dtype=torch.int8, generator=gen)


@pytest.mark.parametrize("quant_type", list(QuantType), ids=lambda q: q.value)
@pytest.mark.parametrize(("arch", "force"), ARCHS, ids=[f"sm{a}{'-force' if f else ''}" for a, f in ARCHS])
def test_matches_the_cpp_loops_and_inverts(quant_type: QuantType, arch: int, force: bool) -> None:
    for i, shape in enumerate(SHAPES[quant_type]):
        w = _random(shape, quant_type.bits, seed=arch + i)
        ours = preprocess_weights_for_mixed_gemm(w, quant_type, arch, force_interleave=force)
        expected = oracle(w.numpy(), quant_type.bits, arch, force, fp8_act=quant_type is QuantType.W4_AFP8)
        assert np.array_equal(ours.numpy(), expected), f"{quant_type.value} sm{arch} {shape}"
        back = unpreprocess_weights_for_mixed_gemm(ours, quant_type, arch, force_interleave=force)
        assert torch.equal(back, w)


def test_2d_input_is_one_expert() -> None:
    w = _random((1, 64, 32), 8, seed=5)
    assert torch.equal(
        preprocess_weights_for_mixed_gemm(w[0], QuantType.W8_A16, 80),
        preprocess_weights_for_mixed_gemm(w, QuantType.W8_A16, 80)[0],
    )


def test_layout_details_per_arch() -> None:
    sm80 = layout_details(QuantType.W8_A16, 80)
    assert (sm80.rows_per_column_tile, sm80.columns_interleaved, sm80.uses_imma_ldsm) == (64, 2, True)
    assert layout_details(QuantType.W4_A16, 80).columns_interleaved == 4
    fp8 = layout_details(QuantType.W4_AFP8, 89)
    assert (fp8.rows_per_column_tile, fp8.columns_interleaved) == (128, 2)
    sm90 = layout_details(QuantType.W8_A16, 90)
    assert (sm90.uses_imma_ldsm, sm90.columns_interleaved, sm90.add_bias_and_interleave) == (False, 1, False)
    assert CutlassMixedGemmLayout(QuantType.W8_A16, 90, force_interleave=True).details == sm80


@pytest.mark.parametrize("arch", [60, 100, 120])
def test_other_architectures_are_refused(arch: int) -> None:
    with pytest.raises(UnsupportedProblemError, match=f"SM {arch}"):
        preprocess_weights_for_mixed_gemm(_random((1, 64, 32), 8, 0), QuantType.W8_A16, arch)


@pytest.mark.parametrize(
    ("shape", "needs"),
    [((48, 32), "K % 64"), ((64, 20), "N % 8"), ((32, 32), "K % 64")],
)
def test_shapes_the_preprocessor_rejects(shape: tuple[int, int], needs: str) -> None:
    w = torch.ones(shape, dtype=torch.int8)
    with pytest.raises(UnsupportedProblemError, match=needs.replace("%", "%")):
        preprocess_weights_for_mixed_gemm(w, QuantType.W8_A16, 80)


def test_non_int8_input_is_refused() -> None:
    with pytest.raises(UnsupportedProblemError, match="expected int8"):
        preprocess_weights_for_mixed_gemm(torch.ones(64, 32), QuantType.W8_A16, 80)
