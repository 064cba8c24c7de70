"""What only a GPU can show of the prefill path that folds the rotations into the weight
(``fold.py``): its dot on 16-bit operands (the interpreter feeds it float32) against the
golden output and against the dequantize + GEMM path, at d = 128 and 64, one pass and
two, a rotation per layer or per group, bf16 and fp16, with a bias and with a running
partial; and the wrapper taking it from the threshold on."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.formats.turboquant import TurboQuant
from quantcore.ops.linear import linear_reference
from tests.turboquant.cuda_layers import DTYPES, FORMATS, cuda_layer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

K, N, M = 1024, 200, 300  # N: a ragged last 128-row program


def _layer(fmt: TurboQuant, dtype: torch.dtype, seed: int) -> tuple[dict[str, torch.Tensor], Any]:
    return cuda_layer(fmt, N, K, dtype, seed)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.slug)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_partial", [False, True], ids=["plain", "partial"])
def test_fold_matches_the_golden_and_the_dequantize_path(fmt: TurboQuant, dtype: torch.dtype,
                                                         with_partial: bool) -> None:
    from quantcore.backends.turboquant_triton.fused import fused_linear

    t, prep = _layer(fmt, dtype, seed=fmt.group_size)
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(M, K, device="cuda", generator=gen).to(dtype)
    partial = torch.randn(M, N, device="cuda", generator=gen) if with_partial else None
    ref = linear_reference(x.cpu(), fmt.dequantize(t), t["bias"])
    if partial is not None:
        ref = ref + partial.cpu().double()
    ys = {path: fused_linear(x, prep.passes, prep.codebook, group_size=fmt.group_size, partial=partial,
                             bias=prep.bias, out_dtype=dtype, path=path) for path in ("fold", "dequant")}
    for path, y in ys.items():
        result = compare(y.cpu(), ref, tolerance_for(dtype))
        assert result.ok, f"{path}: {result.problem}"
    # the two paths round differently (x rotated, or the weight) but agree to a few ulps
    scale = ys["dequant"].float().abs().max()
    assert float((ys["fold"].float() - ys["dequant"].float()).abs().max() / scale) < 2e-2


def test_the_wrapper_folds_from_the_threshold() -> None:
    from quantcore.backends.turboquant_triton import fused

    fmt = TurboQuant(group_size=128, residual=True)
    t, prep = _layer(fmt, torch.bfloat16, seed=3)
    choice = fused._path_choice(torch.device("cuda"))
    m = max(choice.fold_from_m_two_passes, choice.mma_max_m + 1)  # the first M the wrapper folds
    x = torch.randn(m, K, device="cuda").to(torch.bfloat16)
    y = fused.fused_linear(x, prep.passes, prep.codebook, group_size=128, partial=None, bias=prep.bias,
                           out_dtype=torch.bfloat16)
    kinds = {type(b).__name__ for b in fused.launch_state(prep.codebook).values()}
    assert "_Folded" in kinds and "_Dequant" not in kinds
    assert compare(y.cpu(), linear_reference(x.cpu(), fmt.dequantize(t), t["bias"]), tolerance_for(torch.bfloat16)).ok
