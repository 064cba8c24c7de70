"""The fused TurboQuant kernels in cuTile: the same contract and structure as
``quantcore.backends.turboquant_triton.fused`` (read its docstring for the layout).

cuTile works on tiles addressed by tile index: ``ct.load(X, (row, 2g), (1, HALF))`` is
the low half of group g of one activation row, ``(row, 2g + 1)`` the high half. The
codebook lookup is ``ct.gather`` from the 16-entry codebook array (64 bytes, served from
L1). ``_gemm`` keeps the dequantized weight as the left MMA operand
(``acc[N, M] += Ŵ_tile · x_rotᵀ``, the activation loaded transposed with ``order="F"``),
so batches smaller than the MMA's row count waste nothing on padding.
"""

from __future__ import annotations

import cuda.tile as ct
import torch

__all__ = ["fused_pass", "gemm_tiles", "gemv_rows"]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
_ZERO = ct.PaddingMode.ZERO


@ct.kernel
def _gemv(X, Idx, Scale, CB, Out, Partial, Bias,
          HALF: ConstInt, TN: ConstInt, HAS_PARTIAL: ConstBool, HAS_BIAS: ConstBool):
    bid_n = ct.bid(0)
    row = ct.bid(1)
    n_groups = Scale.shape[1]
    acc = ct.zeros((TN,), dtype=ct.float32)
    for g in range(n_groups):
        packed = ct.astype(ct.load(Idx, index=(bid_n, g), shape=(TN, HALF), padding_mode=_ZERO), ct.int32)
        w_lo = ct.gather(CB, packed & 15)
        w_hi = ct.gather(CB, packed >> 4)
        x_lo = ct.astype(ct.load(X, index=(row, 2 * g), shape=(1, HALF)), ct.float32)
        x_hi = ct.astype(ct.load(X, index=(row, 2 * g + 1), shape=(1, HALF)), ct.float32)
        part = ct.sum(w_lo * x_lo + w_hi * x_hi, axis=1)
        scale = ct.reshape(ct.load(Scale, index=(bid_n, g), shape=(TN, 1), padding_mode=_ZERO), (TN,))
        acc = acc + part * scale
    if HAS_PARTIAL:
        acc = acc + ct.reshape(ct.load(Partial, index=(row, bid_n), shape=(1, TN), padding_mode=_ZERO), (TN,))
    if HAS_BIAS:
        acc = acc + ct.load(Bias, index=(bid_n,), shape=(TN,), padding_mode=_ZERO)
    ct.store(Out, index=(row, bid_n), tile=ct.astype(ct.reshape(acc, (1, TN)), Out.dtype))


@ct.kernel
def _gemm(X, Idx, Scale, CB, Out, Partial, Bias,
          HALF: ConstInt, TN: ConstInt, TM: ConstInt, HAS_PARTIAL: ConstBool, HAS_BIAS: ConstBool):
    bid = ct.bid(0)
    num_m = ct.cdiv(X.shape[0], TM)
    bid_n = bid // num_m  # consecutive blocks share a weight stripe: read once, then L2
    bid_m = bid % num_m
    n_groups = Scale.shape[1]
    acc = ct.zeros((TN, TM), dtype=ct.float32)
    for g in range(n_groups):
        packed = ct.astype(ct.load(Idx, index=(bid_n, g), shape=(TN, HALF), padding_mode=_ZERO), ct.int32)
        scale = ct.load(Scale, index=(bid_n, g), shape=(TN, 1), padding_mode=_ZERO)
        w_lo = ct.astype(ct.gather(CB, packed & 15) * scale, X.dtype)
        w_hi = ct.astype(ct.gather(CB, packed >> 4) * scale, X.dtype)
        xt_lo = ct.load(X, index=(2 * g, bid_m), shape=(HALF, TM), order="F", padding_mode=_ZERO)
        xt_hi = ct.load(X, index=(2 * g + 1, bid_m), shape=(HALF, TM), order="F", padding_mode=_ZERO)
        acc = ct.mma(w_lo, xt_lo, acc)
        acc = ct.mma(w_hi, xt_hi, acc)
    if HAS_PARTIAL:
        acc = acc + ct.load(Partial, index=(bid_n, bid_m), shape=(TN, TM), order="F", padding_mode=_ZERO)
    if HAS_BIAS:
        acc = acc + ct.reshape(ct.load(Bias, index=(bid_n,), shape=(TN,), padding_mode=_ZERO), (TN, 1))
    ct.store(Out, index=(bid_n, bid_m), tile=ct.astype(acc, Out.dtype), order="F")


def gemv_rows(n: int) -> int:
    """Rows of the weight per GEMV block: enough blocks to fill the GPU at decode."""
    return 16 if n <= 8192 else 32


def gemm_tiles(m: int) -> tuple[int, int]:
    """(TN, TM): the weight tile stays 128 rows; the activation tile follows the batch."""
    tm = 16
    while tm < m and tm < 128:
        tm *= 2
    return 128, tm


def fused_pass(
    x_rot: torch.Tensor,
    idx: torch.Tensor,
    scale: torch.Tensor,
    codebook: torch.Tensor,
    *,
    group_size: int,
    partial: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    m, _ = x_rot.shape
    n = idx.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=x_rot.device)
    if m == 0:
        return out
    stream = torch.cuda.current_stream(x_rot.device)
    half = group_size // 2
    args = (x_rot, idx, scale, codebook, out,
            partial if partial is not None else out, bias if bias is not None else scale[:, 0])
    flags = (partial is not None, bias is not None)
    if m == 1:
        tn = gemv_rows(n)
        ct.launch(stream, (-(-n // tn), m, 1), _gemv, (*args, half, tn, *flags))
    else:
        tn, tm = gemm_tiles(m)
        grid = (-(-m // tm) * -(-n // tn), 1, 1)
        ct.launch(stream, grid, _gemm, (*args, half, tn, tm, *flags))
    return out
