"""Step 1, ``permute_B_rows_for_mixed_gemm``: the row permutation for LDSM (arch >= 75).

On row-major ``[E, K, N·bits/8]`` bytes, rows (K) go in blocks of ``B = rows_per_mma``
(16 for int8, 32 for int4); within a block, output row r takes input row ``perm[r]``::

    out[e, B·b + r, :] = in[e, B·b + perm[r], :]

Upstream moves 32-bit words; whole rows move, so bytes give the same result. The
effect is that after LDSM each thread holds the rows its MMA fragment needs although
the weight is narrower than the 16-bit activation.
"""

from __future__ import annotations

import torch

from .quant_type import QuantType

__all__ = ["permute_rows", "unpermute_rows"]


def _apply(w: torch.Tensor, index: list[int], block: int) -> torch.Tensor:
    e, k, nb = w.shape
    idx = torch.tensor(index, device=w.device)
    return w.reshape(e, k // block, block, nb).index_select(2, idx).reshape(e, k, nb)


def permute_rows(w: torch.Tensor, quant_type: QuantType) -> torch.Tensor:
    return _apply(w, list(quant_type.row_permutation), quant_type.rows_per_mma)


def unpermute_rows(w: torch.Tensor, quant_type: QuantType) -> torch.Tensor:
    perm = quant_type.row_permutation
    inverse = [perm.index(r) for r in range(len(perm))]
    return _apply(w, inverse, quant_type.rows_per_mma)
