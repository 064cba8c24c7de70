"""Every entry of the table this card takes, run at its own layer shape and M bucket in
both 16-bit dtypes against the float golden: a bf16-tuned entry also serves fp16
(``configs._entry``), so each tuned geometry must be right in the dtype it was not
timed in too."""

from __future__ import annotations

import functools

import pytest
import torch

from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.formats.turboquant import TurboQuant
from quantcore.ops.linear import linear_reference

from .cuda_layers import DTYPES, prepared_on_cuda, quantized_layer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@functools.lru_cache(maxsize=2)
def _layer(k: int, n: int, passes: int) -> tuple[TurboQuant, dict[str, torch.Tensor], torch.Tensor]:
    """A layer quantized once for both dtypes' cases, and its dequantized weight."""
    fmt = TurboQuant(group_size=128, residual=passes == 2)
    t = quantized_layer(fmt, n, k, seed=k + n + passes)
    return fmt, t, fmt.dequantize(t)


def _entries() -> list[tuple[str, int, int, int, int]]:
    """(kernel, K, N, passes, M) for every gemv, mma and mma_decode entry of this card's table."""
    if not torch.cuda.is_available():
        return []
    from quantcore.backends.turboquant_triton import configs
    from quantcore.probe.card import card_key

    out = []
    for key in configs.table(card_key(0)):
        if key[0] == "gemv":
            out.append(("gemv", key[1], key[2], key[4], 1))
        elif key[0] in ("mma", "mma_decode"):
            out.append((key[0], key[1], key[2], key[4], key[6]))
    return sorted(set(out))


@pytest.mark.parametrize(("kernel", "k", "n", "passes", "m"), _entries())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_each_table_entry_matches_golden_in_both_16_bit_dtypes(
        kernel: str, k: int, n: int, passes: int, m: int, dtype: torch.dtype) -> None:
    from quantcore.backends.turboquant_triton import configs
    from quantcore.backends.turboquant_triton.fused import fused_linear
    from quantcore.probe.card import card_key

    fmt, t, w_hat = _layer(k, n, passes)
    prep = prepared_on_cuda(fmt, t, dtype)
    rows = m if kernel != "mma" else m - 3  # inside the bucket, not its top (a decode entry's rows are its own)
    if kernel == "mma":
        assert configs.mma_entry(card_key(0), rows, k, n, 128, passes, dtype) is not None
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    y = fused_linear(x.cuda(), prep.passes, prep.codebook, group_size=128, partial=None, bias=prep.bias,
                     out_dtype=dtype, path=kernel)
    result = compare(y.cpu(), linear_reference(x, w_hat, t["bias"]), tolerance_for(dtype))
    assert result.ok, result.problem
