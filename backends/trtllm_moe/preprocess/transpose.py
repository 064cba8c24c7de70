"""Step 2, ``subbyte_transpose``: row-major ``[K, N]`` → ``[N, K]`` (column-major B).

Element by element: ``out[e, n, k] = in[e, k, n]``. For int4 the nibbles move one by one
and are packed again along the new rows, the even element in the low nibble, so byte
``(n, k // 2)`` of the output holds elements k (low) and k + 1 (high) of column n.
Upstream tiles the copy in 64 × 64-element blocks for speed; the result is the plain
transpose whenever its size checks pass (both byte extents multiples of 32).

The transpose of ``[N, K]`` gives ``[K, N]`` back, so the function is its own inverse.
"""

from __future__ import annotations

import torch

from .nibbles import pack_nibbles, unpack_nibbles
from .quant_type import QuantType

__all__ = ["subbyte_transpose"]


def subbyte_transpose(w: torch.Tensor, quant_type: QuantType) -> torch.Tensor:
    """``[E, R, C·bits/8]`` bytes → ``[E, C, R·bits/8]`` bytes."""
    if quant_type.bits == 8:
        return w.transpose(1, 2).contiguous()
    return pack_nibbles(unpack_nibbles(w).transpose(1, 2)).contiguous()
