"""Step 3, ``interleave_column_major_tensor``: ``ColumnMajorTileInterleave<R, I>``.

On the column-major ``[E, N, K]`` result, each column is ``K·bits/32`` words long
(``num_vec_rows``); tiles are ``R`` elements (``vpt = R·bits/32`` words) of a column, and
``I`` columns are interleaved tile by tile. For column c and word row v::

    write_col     = c // I
    base          = v − v % vpt
    vec_write_row = I · base + vpt · (c % I) + v % vpt
    out_word[e, write_col · num_vec_rows · I + vec_write_row] = in_word[e, c · num_vec_rows + v]

So output column-group ``c // I`` is the sequence, over K-tiles t: tile t of column
``I·(c//I)``, tile t of the next column, …: ``[E, N/I, K/R, I, R·bits/8]`` bytes. For int8
with fp16 activations (R = 64, I = 2): 128-byte runs of (64 K of column 2j, 64 K of
column 2j + 1). Words move whole, so bytes give the same result.
"""

from __future__ import annotations

import torch

from .layout import LayoutDetails

__all__ = ["deinterleave_columns", "interleave_columns"]




def interleave_columns(w: torch.Tensor, details: LayoutDetails) -> torch.Tensor:
    """``[E, N, K·bits/8]`` → ``[E, N / I, I · K·bits/8]``."""
    e, n, kb = w.shape
    i = details.columns_interleaved
    tb = details.rows_per_column_tile * details.quant_type.bits // 8
    return w.reshape(e, n // i, i, kb // tb, tb).permute(0, 1, 3, 2, 4).reshape(e, n // i, i * kb)


def deinterleave_columns(w: torch.Tensor, details: LayoutDetails) -> torch.Tensor:
    """Inverse of :func:`interleave_columns`: ``[E, N / I, I · K·bits/8]`` → ``[E, N, K·bits/8]``."""
    e, groups, ikb = w.shape
    i = details.columns_interleaved
    tb = details.rows_per_column_tile * details.quant_type.bits // 8
    kb = ikb // i
    return w.reshape(e, groups, kb // tb, i, tb).permute(0, 1, 3, 2, 4).reshape(e, groups * i, kb)
