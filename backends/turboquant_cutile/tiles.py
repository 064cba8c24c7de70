"""The fused TurboQuant kernels in cuTile: the pass contract of
:mod:`quantcore.kernels.turboquant.fused`, on the split-halves layout of
:mod:`quantcore.transforms.turboquant_passes` (``split_halves=True``).

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

__all__ = ["GEMM_ROWS", "GEMM_STEP_BYTES", "GEMV_ROWS", "fused_pass", "gemm_tiles", "gemv_rows"]

ConstInt = ct.Constant[int]
_ZERO = ct.PaddingMode.ZERO


@ct.kernel
def _gemv(X, Idx, Scale, CB, Out, Partial, Bias,
          HAS_PARTIAL, HAS_BIAS, HALF: ConstInt, TN: ConstInt):
    bid_n = ct.bid(0)
    row = ct.bid(1)
    n_groups = Scale.shape[1]
    acc = ct.zeros((TN,), dtype=ct.float32)
    for g in range(n_groups):
        packed = ct.astype(ct.load(Idx, index=(bid_n, g), shape=(TN, HALF), padding_mode=_ZERO), ct.int32)
        w_lo = ct.gather(CB, packed & 15, check_bounds=False, latency=1)
        w_hi = ct.gather(CB, packed >> 4, check_bounds=False, latency=1)
        x_lo = ct.astype(ct.load(X, index=(row, 2 * g), shape=(1, HALF)), ct.float32)
        x_hi = ct.astype(ct.load(X, index=(row, 2 * g + 1), shape=(1, HALF)), ct.float32)
        part = ct.sum(w_lo * x_lo + w_hi * x_hi, axis=1)
        scale = ct.reshape(ct.load(Scale, index=(bid_n, g), shape=(TN, 1), padding_mode=_ZERO), (TN,))
        acc = acc + part * scale
    if HAS_PARTIAL != 0:
        acc = acc + ct.reshape(ct.load(Partial, index=(row, bid_n), shape=(1, TN), padding_mode=_ZERO), (TN,))
    if HAS_BIAS != 0:
        acc = acc + ct.load(Bias, index=(bid_n,), shape=(TN,), padding_mode=_ZERO)
    ct.store(Out, index=(row, bid_n), tile=ct.astype(ct.reshape(acc, (1, TN)), Out.dtype))


@ct.kernel
def _gemm(X, Idx, Scale, CB, Out, Partial, Bias,
          HAS_PARTIAL, HAS_BIAS, HALF: ConstInt, TN: ConstInt, TM: ConstInt, TK: ConstInt):
    bid = ct.bid(0)
    num_m = ct.cdiv(X.shape[0], TM)
    bid_n = bid // num_m  # consecutive blocks share a weight stripe: read once, then L2
    bid_m = bid % num_m
    n_groups = Scale.shape[1]
    chunks = HALF // TK  # TK bytes of a group's row per step: 2·TK coordinates
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


# Tile sizes: the largest that compile for sm_90 without register spills (checked with
# cuda.tile.compilation.export_kernel and cuobjdump -res-usage; 128-row weight tiles spill).
GEMV_ROWS = 16
GEMM_ROWS = 64
GEMM_STEP_BYTES = 32


def gemv_rows(n: int) -> int:
    """Weight rows per GEMV block."""
    return GEMV_ROWS


def gemm_tiles(m: int, half: int) -> tuple[int, int, int]:
    """(TN, TM, TK): weight rows, activation rows (16 for decode-sized batches, else 64:
    two shapes, so few compilations) and bytes of a group per step."""
    return GEMM_ROWS, 16 if m <= 16 else 64, min(GEMM_STEP_BYTES, half)


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
    # Stand-ins for absent operands have the real ones' dtype and rank, so they do not
    # add compiled variants; the kernel never reads them.
    args = (x_rot, idx, scale, codebook, out,
            partial if partial is not None else scale, bias if bias is not None else codebook)
    # Runtime flags (not constants): every combination shares one compiled kernel, and
    # compiling is what a cuTile kernel's first call pays for.
    flags = (int(partial is not None), int(bias is not None))
    if m == 1:
        tn = gemv_rows(n)
        ct.launch(stream, (-(-n // tn), m, 1), _gemv, (*args, *flags, half, tn))
    else:
        tn, tm, tk = gemm_tiles(m, half)
        grid = (-(-m // tm) * -(-n // tn), 1, 1)
        ct.launch(stream, grid, _gemm, (*args, *flags, half, tn, tm, tk))
    return out
