"""The cuTile kernels of the ``turboquant_cutile`` backend, on the split-halves layout of
:mod:`quantcore.transforms.turboquant_passes` (``split_halves=True``): byte ``j`` of a
group's row holds the codes of coordinates ``j`` (low nibble) and ``HALF + j`` (high
nibble) of the rotated group, and the rotated activation is in the same order.

cuTile addresses tiles by tile index: ``ct.load(X, (row, 2g), (1, HALF))`` is the low half
of group g of one activation row, ``(row, 2g + 1)`` the high half. The codebook lookup is
``ct.gather`` from the 16-entry codebook (64 bytes, served from L1).

This module imports only ``cuda.tile``: the kernels compile ahead of time for a target
(``tests/turboquant/test_cutile_compile.py``) wherever the package and its compiler are.
The launches are in :mod:`.tiles`.
"""

from __future__ import annotations

import cuda.tile as ct

__all__ = ["dequant", "gemm", "gemv"]

ConstInt = ct.Constant[int]
_ZERO = ct.PaddingMode.ZERO


@ct.kernel
def gemv(X, Idx, Scale, CB, Out, Partial, Bias,
         HAS_PARTIAL, HAS_BIAS, HALF: ConstInt, TN: ConstInt):
    """One activation row (``bid(1)``) times ``TN`` weight rows (``bid(0)``). The products
    are kept per coordinate, scaled per group, and summed across the row once at the end:
    a sum across the tile per group would cost a cross-thread reduction every step."""
    bid_n = ct.bid(0)
    row = ct.bid(1)
    n_groups = Scale.shape[1]
    acc = ct.zeros((TN, HALF), dtype=ct.float32)
    for g in range(n_groups):
        packed = ct.astype(ct.load(Idx, index=(bid_n, g), shape=(TN, HALF), padding_mode=_ZERO), ct.int32)
        w_lo = ct.gather(CB, packed & 15, check_bounds=False, latency=1)
        w_hi = ct.gather(CB, packed >> 4, check_bounds=False, latency=1)
        x_lo = ct.astype(ct.load(X, index=(row, 2 * g), shape=(1, HALF)), ct.float32)
        x_hi = ct.astype(ct.load(X, index=(row, 2 * g + 1), shape=(1, HALF)), ct.float32)
        scale = ct.load(Scale, index=(bid_n, g), shape=(TN, 1), padding_mode=_ZERO)
        acc = acc + (w_lo * x_lo + w_hi * x_hi) * scale
    out = ct.sum(acc, axis=1)
    if HAS_PARTIAL != 0:
        out = out + ct.reshape(ct.load(Partial, index=(row, bid_n), shape=(1, TN), padding_mode=_ZERO), (TN,))
    if HAS_BIAS != 0:
        out = out + ct.load(Bias, index=(bid_n,), shape=(TN,), padding_mode=_ZERO)
    ct.store(Out, index=(row, bid_n), tile=ct.astype(ct.reshape(out, (1, TN)), Out.dtype))


@ct.kernel
def gemm(X, Idx, Scale, CB, Out, Partial, Bias,
         HAS_PARTIAL, HAS_BIAS, HALF: ConstInt, TN: ConstInt, TM: ConstInt, TK: ConstInt):
    """``TN`` weight rows times ``TM`` activation rows on the matrix units, ``TK`` bytes of a
    group's row a step. The looked-up weight is the left operand (``acc[N, M] += Ŵ_tile ·
    x_rotᵀ``, the activation loaded transposed with ``order="F"``), so batches smaller than
    the MMA's row count waste nothing on padding."""
    bid = ct.bid(0)
    num_m = ct.cdiv(X.shape[0], TM)
    bid_n = bid // num_m  # consecutive blocks share a weight stripe: read once, then L2
    bid_m = bid % num_m
    n_groups = Scale.shape[1]
    chunks = HALF // TK
    acc = ct.zeros((TN, TM), dtype=ct.float32)
    for step in range(n_groups * chunks):
        g = step // chunks
        c = step % chunks
        packed = ct.astype(ct.load(Idx, index=(bid_n, step), shape=(TN, TK), padding_mode=_ZERO), ct.int32)
        scale = ct.load(Scale, index=(bid_n, g), shape=(TN, 1), padding_mode=_ZERO)
        w_lo = ct.astype(ct.gather(CB, packed & 15, check_bounds=False, latency=1) * scale, X.dtype)
        w_hi = ct.astype(ct.gather(CB, packed >> 4, check_bounds=False, latency=1) * scale, X.dtype)
        x_tile = 2 * chunks * g + c  # tile index of this chunk's low half along K
        xt_lo = ct.load(X, index=(x_tile, bid_m), shape=(TK, TM), order="F", padding_mode=_ZERO)
        xt_hi = ct.load(X, index=(x_tile + chunks, bid_m), shape=(TK, TM), order="F", padding_mode=_ZERO)
        acc = ct.mma(w_lo, xt_lo, acc)
        acc = ct.mma(w_hi, xt_hi, acc)
    if HAS_PARTIAL != 0:
        acc = acc + ct.load(Partial, index=(bid_n, bid_m), shape=(TN, TM), order="F", padding_mode=_ZERO)
    if HAS_BIAS != 0:
        acc = acc + ct.reshape(ct.load(Bias, index=(bid_n,), shape=(TN,), padding_mode=_ZERO), (TN, 1))
    ct.store(Out, index=(bid_n, bid_m), tile=ct.astype(acc, Out.dtype), order="F")


@ct.kernel
def dequant(Idx, Scale, CB, W, HALF: ConstInt, TN: ConstInt):
    """``W[N, K]`` (the rotated coordinates' order) = codebook value × scale for ``TN`` rows
    of one group (``bid(1)``): the weight a dense GEMM then multiplies, for batches large
    enough that the matrix units, not the weight's bytes, bound the time."""
    bid_n = ct.bid(0)
    g = ct.bid(1)
    packed = ct.astype(ct.load(Idx, index=(bid_n, g), shape=(TN, HALF), padding_mode=_ZERO), ct.int32)
    scale = ct.load(Scale, index=(bid_n, g), shape=(TN, 1), padding_mode=_ZERO)
    w_lo = ct.gather(CB, packed & 15, check_bounds=False, latency=1) * scale
    w_hi = ct.gather(CB, packed >> 4, check_bounds=False, latency=1) * scale
    ct.store(W, index=(bid_n, 2 * g), tile=ct.astype(w_lo, W.dtype))
    ct.store(W, index=(bid_n, 2 * g + 1), tile=ct.astype(w_hi, W.dtype))

