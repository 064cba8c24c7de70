"""A TurboQuant-4 decode kernel (M ≤ 8) on ``mma.sync`` with the looked-up weight as the A
operand straight from registers: the structure of ``hopper_wgmma``'s warp-level decode
kernel (``backends/hopper_wgmma/decode.py``) over TurboQuant's indices. Checked against
the float64 golden and timed beside the shipped ``turboquant_triton`` call and cuBLAS
bf16 on an sm_90 GPU; compiled for sm_90a on any machine (``--report``).

    python -m tools.probes.turboquant_mma_decode --report
    python -m tools.probes.turboquant_mma_decode --shapes 4096x14336 --passes 1,2 --splits 4,8 [--json PATH]
    python -m tools.probes.turboquant_mma_decode --wide 0,1 --xvec 0,1 --tiles 2 --lean [--json PATH]

``--wide``/``--xvec`` (each ``0``, ``1`` or ``0,1``): the shipped-layout kernel's options
(``decode_mma.mma_decode(wide=, xvec=)``: two groups a step, each row's whole 128-byte
line; x staged with 16-byte loads), every pair checked (bf16: golden, its emulation, the
same bits call to call) and timed beside the shipped call, the fragment-order kernel and
cuBLAS.

**What it computes.** Every pass is one GEMV of depth P·K over the rotated input: x is
rotated by every pass's rotation in one GEMM before the launch
(``quantcore/kernels/turboquant/rotation.py``: ``x_rot`` is ``[M, G, P, d]`` in memory),
and the weight is the passes' index groups side by side in the same order, block
``b = g·P + p`` holding pass p's group g (one group of d = 128 is one block of the GPTQ
layout: 16 int32 words a row), with one fp32 scale (``norm / √d``) per (row, block).

**Layout** (:func:`pair_words`). Within a block, word c holds the 4-bit codes of inputs
2c and 2c + 1 of each 32-input slice i in byte i (input 2c in the low nibble): a stored
group's 64 bytes ``B[16i + c]`` transposed ``[4, 16] → [16, 4]``. The words are then put
in ``hopper_wgmma``'s fragment order (``layout.fragment_order``), so a thread's two 16-byte
loads are its A-fragment registers of a block, as in the GPTQ kernel.

**Lookup.** A 256-entry table of centroid pairs ``(c[e & 15], c[e >> 4])`` rounded to the
activation dtype (one 32-bit word: exactly an A register of the MMA), ``COPIES`` copies an
entry in shared memory (static, declared in PTX), lane l reading copy ``l mod COPIES``:
with 32 copies a warp's 32 reads fall in 32 banks, with 16 two lanes share a bank (at most
two wavefronts a load, half the table). Per pair of weights: one shift, one LOP3 (mask the
byte, OR the lane's copy offset) and one ``LDS``. The lane's offset is an operand computed
once from the A layout (a wrong lane would only cost bank conflicts: every copy is equal).

**Per block** (as the GPTQ kernel): 4 slices × (16 lookups a thread, ``ldmatrix`` of x's
slice, ``mma.sync.m16n8k16``), the block's fp32 product scaled into the accumulator. Split
over K between programs, partials summed in slot order by the last program of a tile
(``quantcore/triton/gluon_split_k.tile_store``): deterministic, the same bits call to call. ``TILES`` > 1 puts
that many 64-row tiles in one program (8 or 16 warps) sharing the table and x's staging,
so 32 copies (conflict-free) fit with a program an SM fewer.

sm_90a (``--report``): 53 registers, no spills, 2.32 SASS instructions a weight in the walk
(per pair: SHF, LOP3, LDS; per slice one LDSM and two HMMA), against 2.25 for the GPTQ
kernel and 3.9–4.8 for the shipped decode kernel; 16 KB table + 2 KB of x a step.

**Measured** (one H200, ``benchmarks/results/probes/turboquant_mma_decode-nvidia-h200.json``;
CUDA graphs over weight sets larger than L2, bf16, M = 1, µs; the new kernel's best split,
the rotation GEMM before it included, and its decode launch alone):

============  ======  ======  ===============  ===================  ===========
K × N         passes  cuBLAS  shipped          new (best split)     decode alone
============  ======  ======  ===============  ===================  ===========
4096×14336    1       32.86   **18.57**        24.34 (split 4)      22.08
14336×4096    1       32.38   **21.29**        22.02 (8)            19.54
4096×4096     1       13.45   **9.40**         12.34 (4)            9.95
4096×14336    2       32.27   **36.91**        38.75 (8)            36.43
14336×4096    2       32.86   54.40            **40.32** (16)       37.77
4096×4096     2       13.35   21.60            **16.00** (8)        13.64
============  ======  ======  ===============  ===================  ===========

Right everywhere (bf16 2.5–3.4e-3 of the float64 golden, the shipped path 2.3–2.7e-3; fp16
3–4e-4; 1 and 2 passes, M = 1, 3, 8, bias, K = 1408 whose split runs past the end, N =
1000; within 1.2e-5 of :func:`emulate`), bit-identical call to call. Faster than the
shipped call only with two passes on the two shapes where the shipped kernel is slowest
(1.35×); slower with one pass. The rotation launch costs 2.3–2.6 µs (programmatic dependent
launch gains nothing: within ±0.3 µs); 32 copies were slower (48 KB a program: 4 programs
an SM, more than a wave). Why the decode launch alone is 22 µs where the GPTQ kernel on the
same words is 14.7: the table loads. 32 LDS a warp and block, two wavefronts each with 16
copies, are about 7 µs of the shared-memory pipe per SM on 4096×14336 (the GPTQ kernel's
LDSM ~1.8 µs), and the 16 KB table and 2 KB a step of x leave 6 programs an SM (792 < 896 at
split 4). Long runs of x staged up front cost occupancy too (14336×4096, two passes: split 4
stages 112 KB a program, 73 µs against 40 at split 16).

**On the shipped layout** (``backends/turboquant_triton/decode_mma.py``: the same walk over
``PassData.indices`` as stored, x staged in the k-slot order instead; one H200,
``benchmarks/results/probes/turboquant_mma_decode-shipped-layout-nvidia-h200.json``, bf16,
µs with the rotation, best split and tile count of each):

============  ======  ======  =======  ==============  =============
K × N         passes  M       shipped  fragment order  shipped layout
============  ======  ======  =======  ==============  =============
4096×14336    1       1       18.88    21.92           26.10
4096×14336    1       8       27.05    23.78           35.02
4096×14336    2       1       36.77    35.14           48.15
4096×14336    2       8       46.31    37.86           64.76
14336×4096    1       1       21.32    20.80           24.63
14336×4096    1       8       26.58    21.88           31.71
14336×4096    2       1       53.26    31.42           52.79
14336×4096    2       8       49.06    33.71           67.30
4096×4096     1       1       9.58     11.99           12.77
4096×4096     1       8       13.16    12.89           14.77
4096×4096     2       1       21.63    15.94           17.28
4096×4096     2       8       20.91    16.88           21.98
============  ======  ======  =======  ==============  =============

Right (bf16 2.5–3.4e-3 of the golden, fp16 3.3–4.1e-4, within 4.7e-5 of its emulation),
bit-identical call to call, counters left at zero; but slower than the fragment order
everywhere and than the shipped call on the large layers: a tile's block is 64 rows of 64
bytes K/2 bytes apart instead of 4 KB in one run, and at M = 8 x's permuted staging costs
more (4-byte gathers). Some variants of that run failed to launch (a specialisation of the
arguments that missed the shared-memory opt-in, fixed since).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from quantcore.backends.hopper_wgmma.decode import (
    _as_operand,
    _diagonal_sum,
    _mma_layout,
    _words_layout,
    decode_grid,
    whole_runs,
)
from quantcore.backends.hopper_wgmma.layout import TILE_N, fragment_order, row_order
from quantcore.backends.turboquant_triton import decode_mma as shipped_layout
from quantcore.backends.turboquant_triton.decode_mma import _FILL, _lane_offsets, looked_up_product
from quantcore.triton.gluon_split_k import tile_store, wait_for_prior_grids

__all__ = ["TQMmaWeights", "compile_report", "emulate", "operand_codes", "pair_words", "prepare", "unpack_pair_words"]

#: Inputs of a block (one TurboQuant group of d = 128) and int32 words of one block row.
BK = 128
BLOCK_WORDS = 16
#: Where the check and the timing run (an sm_90 GPU).
DEVICE = "cuda"


@gluon.jit
def _tq_block(acc, words, s0, b, x_smem, lane16, G: gl.constexpr, COLS: gl.constexpr, COPIES: gl.constexpr,
              act: gl.constexpr, mma_layout: gl.constexpr, a_layout: gl.constexpr, b_layout: gl.constexpr):
    """Step ``b``: the ``G`` row groups' blocks looked up slice by slice into the A
    registers, multiplied by x's slice from shared memory; the block's product scaled into
    ``acc``."""
    w16 = _as_operand(words, G, a_layout)
    return looked_up_product(acc, w16, s0, b, x_smem, lane16, G * 64, COLS, COPIES, act, mma_layout, b_layout)


@gluon.jit
def _tq_fetch(w_ptr, w_offs, t_w, g_w, r_c, g_c, first, b, blocks, s_ptr, NP, KW: gl.constexpr,
              STEPS: gl.constexpr):
    """Step ``b``'s words of every row group (``t_w``: its tile, ``g_w``: its K-group) and
    the scale of each accumulator row (``r_c``, K-group ``g_c``); past the weight's end the
    last block (x is zero there)."""
    blk_w = gl.minimum(first + g_w * STEPS + b, blocks - 1)
    blk_c = gl.minimum(first + g_c * STEPS + b, blocks - 1)
    words = gl.load(w_ptr + (t_w * blocks + blk_w) * 2048 + w_offs, eviction_policy="evict_first")
    return words, gl.load(s_ptr + blk_c * NP + r_c)


@gluon.jit
def _stage_x(x_ptr, x_smem, M, K, stride_xm, first, KW: gl.constexpr, TILES: gl.constexpr, STEPS: gl.constexpr,
             EVEN_K: gl.constexpr, ROWS: gl.constexpr):
    """x of the program's blocks into shared memory ``[STEPS·4, KW·ROWS, 32]`` (as
    ``hopper_wgmma.decode._stage_x``, on ``4·KW·TILES`` warps): entry ``(4·b + sl,
    ROWS·g + m, k)`` is input ``32·(4·(first + STEPS·g + b) + sl) + k`` of row m (zero past M
    and K)."""
    layout: gl.constexpr = gl.BlockedLayout([1, 1, 8 // TILES], [1, 8, 4], [4, KW, TILES], [2, 1, 0])
    sl = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
    gm = gl.arange(0, KW * ROWS, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
    k = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
    kk = (gl.expand_dims(gl.expand_dims(sl * 32, 1), 2) + gl.expand_dims(gl.expand_dims(k, 0), 1)
          + gl.expand_dims(gl.expand_dims((gm // ROWS) * (STEPS * 128), 0), 2))
    mm = gl.expand_dims(gl.expand_dims(gm % ROWS, 0), 2)
    offs = mm.to(gl.int64) * stride_xm + kk
    # The same bytes seen as [STEPS, 4·KW·ROWS, 32]: the 64-byte swizzle repeats every 8 rows.
    view = x_smem._reinterpret(x_smem.dtype, [STEPS, 4 * KW * ROWS, 32], x_smem.layout)
    for b in gl.static_range(STEPS):
        k0 = (first + b) * 128
        mask = mm < M
        if not EVEN_K:
            mask = mask & (k0 + kk < K)
        x = gl.load(x_ptr + k0 + offs, mask=mask, other=0.0)
        view.index(b).store(gl.reshape(x, [4 * KW * ROWS, 32]))


@gluon.jit
def tq_decode_kernel(
    w_ptr, x_ptr, s_ptr, cb_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr,
    M, N, K, stride_xm, stride_ym, NP, blocks, split_k,
    HAS_BIAS: gl.constexpr, SPLIT: gl.constexpr, EVEN_K: gl.constexpr, KW: gl.constexpr, STEPS: gl.constexpr,
    COPIES: gl.constexpr, PDL: gl.constexpr = False, TILES: gl.constexpr = 1,
):
    """``w_ptr``: :func:`pair_words` as int16 (``[tiles, blocks·2048]``); ``x_ptr``: x_rot
    ``[M, K]`` (K = P·in_features; row stride ``stride_xm``); ``s_ptr``: fp32 scales
    ``[blocks, NP]``; ``cb_ptr``: the fp32 codebook (16). Grid ``(ceil(tiles / TILES),
    split)``: program ``(c, p)`` of ``4·KW·TILES`` warps walks ``STEPS`` blocks of each of
    its ``KW`` K-groups (as the GPTQ decode kernel), or of each of its ``TILES`` tiles of 64
    rows, which share x's staging and the table; two steps in flight a warp. ``PDL``
    (launched with programmatic dependence): the first two steps' words and scales are read
    and the table filled while the launch before (the rotation that writes x_rot)
    finishes; x and every write wait."""
    gl.static_assert(KW == 1 or TILES == 1, "K-groups or tiles, not both")
    ROWS: gl.constexpr = 8
    G: gl.constexpr = KW * TILES
    act: gl.constexpr = x_ptr.dtype.element_ty
    FP16: gl.constexpr = act == gl.float16
    mma_layout: gl.constexpr = _mma_layout(G)
    a_layout: gl.constexpr = gl.DotOperandLayout(0, mma_layout, 2)
    b_layout: gl.constexpr = gl.DotOperandLayout(1, mma_layout, 2)
    words_layout: gl.constexpr = _words_layout(G)

    cta = gl.program_id(0)
    pid_k = gl.program_id(1)
    tiles = NP // 64
    n0 = cta * (64 * TILES)
    first = pid_k * (KW * STEPS)

    g_w = gl.arange(0, G, layout=gl.SliceLayout(1, gl.SliceLayout(2, words_layout)))
    rows_w = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, words_layout)))
    cols_w = gl.arange(0, 256, layout=gl.SliceLayout(0, gl.SliceLayout(1, words_layout)))
    w_offs = gl.expand_dims(gl.expand_dims(rows_w * 256, 0), 2) + gl.expand_dims(gl.expand_dims(cols_w, 0), 1)
    g_w = gl.expand_dims(gl.expand_dims(g_w, 1), 2)
    rows_c = gl.arange(0, G * 64, layout=gl.SliceLayout(1, mma_layout))
    if TILES == 1:
        t_w = (g_w * 0 + cta).to(gl.int64)
        g_c, r_c = rows_c // 64, n0 + rows_c % 64
    else:  # the last program's tiles past the weight read its last tile (never stored)
        t_w = gl.minimum(cta * TILES + g_w, tiles - 1).to(gl.int64)
        g_w = g_w * 0
        g_c, r_c = rows_c * 0, gl.minimum(n0 + rows_c, NP - 1)

    w_a, sa = _tq_fetch(w_ptr, w_offs, t_w, g_w, r_c, g_c, first, 0, blocks, s_ptr, NP, KW, STEPS)
    w_b, sb = _tq_fetch(w_ptr, w_offs, t_w, g_w, r_c, g_c, first, 1, blocks, s_ptr, NP, KW, STEPS)
    gl.inline_asm_elementwise(_FILL[(COPIES == 32) * 2 + FP16], "=r,l", [cb_ptr], dtype=gl.int32, is_pure=False,
                              pack=1)
    lane16 = _lane_offsets(G, COPIES, a_layout)
    x_smem = gl.allocate_shared_memory(act, [STEPS * 4, KW * ROWS, 32],
                                       gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2))
    if PDL:
        wait_for_prior_grids()
    _stage_x(x_ptr, x_smem, M, K, stride_xm, first, KW, TILES, STEPS, EVEN_K, ROWS)
    gl.thread_barrier()  # x staged and the table filled
    acc = gl.zeros([G * 64, KW * ROWS], gl.float32, mma_layout)
    for b in range(0, STEPS, 2):
        acc = _tq_block(acc, w_a, sa, b, x_smem, lane16, G, KW * ROWS, COPIES, act, mma_layout, a_layout, b_layout)
        w_a, sa = _tq_fetch(w_ptr, w_offs, t_w, g_w, r_c, g_c, first, gl.minimum(b + 2, STEPS - 1), blocks, s_ptr,
                            NP, KW, STEPS)
        if b + 1 < STEPS:
            acc = _tq_block(acc, w_b, sb, b + 1, x_smem, lane16, G, KW * ROWS, COPIES, act, mma_layout, a_layout,
                            b_layout)
        w_b, sb = _tq_fetch(w_ptr, w_offs, t_w, g_w, r_c, g_c, first, gl.minimum(b + 3, STEPS - 1), blocks, s_ptr,
                            NP, KW, STEPS)
    out = acc if KW == 1 else _diagonal_sum(acc, KW, mma_layout)
    tile_store(out, cta, pid_k, n0, 0, b_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, stride_ym, split_k, SPLIT, HAS_BIAS,
                64 * TILES, ROWS, 4 * G)


# --- layout ------------------------------------------------------------------------------


def pair_words(indices: Sequence[torch.Tensor]) -> torch.Tensor:
    """The passes' stored indices (each ``[N, K/2]`` uint8, d = 128) → int32 words
    ``[N/64 rounded up, blocks·1024]``, blocks = P·K/128 with block ``g·P + p`` pass p's
    group g; in a block row word c holds byte i = codes of inputs ``32i + 2c`` (low nibble)
    and ``32i + 2c + 1`` (module docstring), in the fragment order. Rows past N are 0."""
    n, half = indices[0].shape
    groups, passes = half * 2 // BK, len(indices)
    np_ = -(-n // TILE_N) * TILE_N
    b = torch.zeros(np_, groups, passes, BK // 2, dtype=torch.uint8, device=indices[0].device)
    for p, idx in enumerate(indices):
        b[:n, :, p] = idx.reshape(n, groups, BK // 2)
    b = b.view(np_, groups * passes, 4, 16).transpose(-1, -2).contiguous()  # [row, block, c, i]
    return fragment_order(b.view(np_, groups * passes * BK // 2).view(torch.int32))


def unpack_pair_words(frag: torch.Tensor, n: int, k: int, passes: int) -> list[torch.Tensor]:
    """Inverse of :func:`pair_words`: each pass's ``[N, K/2]`` uint8 indices."""
    words = row_order(frag)[:n].contiguous()
    groups = k // BK
    b = words.view(torch.uint8).view(n, groups * passes, 16, 4).transpose(-1, -2)  # [row, block, i, c]
    b = b.reshape(n, groups, passes, BK // 2)
    return [b[:, :, p].reshape(n, k // 2).contiguous() for p in range(passes)]


def operand_codes(frag: torch.Tensor, tile: int, block: int, sl: int) -> torch.Tensor:
    """What the kernel's A operand of slice ``sl`` of ``block`` of ``tile`` looks up, replayed
    on the CPU: the ``[64, 32]`` codes (row, input of the slice), from the int16 words as the
    kernel reads them (``_words_layout``, ``_as_operand``'s reshape and permute) and the
    byte and nibbles the lookup takes of each 32-bit pair."""
    w16 = frag[tile].view(torch.int16).view(-1, 8, 256)[block]  # rows 4h + w, columns 8·lane + 2j + b
    w7 = w16.reshape(2, 4, 8, 4, 4, 2).permute(1, 0, 2, 4, 3, 5)  # (w, h, lane/4, j, u, b)
    op = w7.reshape(64, 32).to(torch.int64) & 0xFFFF
    pair = op[:, 0::2] | (op[:, 1::2] << 16)  # the 32-bit register of inputs 2c, 2c + 1
    byte = (pair >> (8 * sl)) & 0xFF
    out = torch.empty(64, 32, dtype=torch.int64)
    out[:, 0::2], out[:, 1::2] = byte & 15, byte >> 4
    return out


# --- prepared state and launch -------------------------------------------------------------


@dataclass
class TQMmaWeights:
    qweight: torch.Tensor  # int32 [tiles, blocks·1024]
    scales: torch.Tensor  # fp32 [blocks, NP]
    codebook: torch.Tensor  # fp32 [16]
    bias: torch.Tensor | None
    rhs: Any  # quantcore.kernels.turboquant.rotation.InputRotation
    in_features: int
    out_features: int
    passes: int
    counters: torch.Tensor  # int32 [tiles]: the split-K tickets, back to 0 after each launch

    @property
    def blocks(self) -> int:
        return self.passes * self.in_features // BK

    @property
    def tiles(self) -> int:
        return self.qweight.shape[0]


def prepare(prepared: Any) -> TQMmaWeights:
    """From ``TurboQuantTriton.prepare``'s state (d = 128, rotations in the activation dtype)."""
    from quantcore.kernels.turboquant.rotation import InputRotation

    passes = prepared.passes
    n, k = prepared.out_features, prepared.in_features
    if prepared.group_size != BK:
        raise ValueError(f"group size {prepared.group_size}: this kernel takes d = {BK}")
    np_ = -(-n // TILE_N) * TILE_N
    g = k // BK
    s = torch.zeros(g, len(passes), np_, dtype=torch.float32, device=prepared.codebook.device)
    for p, data in enumerate(passes):
        s[:, p, :n] = data.scales.T
    qw = pair_words([data.indices for data in passes])
    return TQMmaWeights(qweight=qw, scales=s.view(g * len(passes), np_).contiguous(), codebook=prepared.codebook,
                        bias=prepared.bias, rhs=InputRotation([data.rotation for data in passes]), in_features=k,
                        out_features=n, passes=len(passes),
                        counters=torch.zeros(qw.shape[0], dtype=torch.int32, device=qw.device))


_opted: dict[int, Any] = {}


def decode(xr: torch.Tensor, w: TQMmaWeights, split: int, groups: int = 1, copies: int = 16,
           out_dtype: torch.dtype | None = None, pdl: bool = False, tiles: int = 1) -> torch.Tensor:
    """One launch over the rotated input ``xr`` ``[M, P·K]`` (M ≤ 8); ``tiles`` row tiles
    of 64 a program (with one K-group)."""
    m, kk = xr.shape
    n = w.out_features
    steps, split = decode_grid(w.blocks, split, groups)
    y = torch.empty(m, n, dtype=out_dtype or xr.dtype, device=xr.device)
    ws = torch.empty(max(1, split) * m * n, dtype=torch.float32, device=xr.device)
    bias = w.bias if w.bias is not None else w.scales
    args = (w.qweight.view(torch.int16), xr, w.scales, w.codebook, bias, y, ws, w.counters,
            m, n, kk, xr.stride(0), y.stride(0), w.scales.shape[1], w.blocks, split)
    const = dict(HAS_BIAS=w.bias is not None, SPLIT=split > 1, EVEN_K=whole_runs(kk, 4, w.blocks, steps, groups),
                 KW=groups, STEPS=steps, COPIES=copies, PDL=pdl, TILES=tiles, num_warps=4 * groups * tiles)
    if pdl:
        const["launch_pdl"] = True
    grid = (-(-w.tiles // tiles), split)
    # The static table beside Triton's shared memory may pass 48 KB: each compiled variant
    # opts in before its first launch (a probe's launch: the host cost is not timed).
    compiled = tq_decode_kernel.warmup(*args, grid=grid, **const)
    if id(compiled) not in _opted:
        from quantcore.triton.static_shared import opt_in

        opt_in(compiled)
        _opted[id(compiled)] = compiled
    tq_decode_kernel[grid](*args, **const)
    return y


def linear(x: torch.Tensor, w: TQMmaWeights, split: int, groups: int = 1, copies: int = 16,
           pdl: bool = False, tiles: int = 1) -> torch.Tensor:
    """``y = x·Ŵᵀ + b``: the rotation GEMM of every pass, then one decode launch."""
    m = x.shape[0]
    xr = w.rhs(x.contiguous()).view(m, w.passes * w.in_features)
    return decode(xr, w, split, groups, copies, x.dtype, pdl, tiles)


def emulate(x: torch.Tensor, w: TQMmaWeights) -> torch.Tensor:
    """The kernel's arithmetic in torch (CPU or GPU): centroid pairs rounded to x's dtype,
    x rotated in its dtype, each block's product in fp32 scaled once; the output rounded."""
    m = x.shape[0]
    n, k, p = w.out_features, w.in_features, w.passes
    xr = w.rhs(x.contiguous()).view(m, p * k).float()
    cb = w.codebook.to(x.dtype).float()
    codes = torch.cat([c.view(n, k // BK, 1, BK // 2) for c in unpack_pair_words(w.qweight.cpu(), n, k, p)], 2)
    idx = torch.stack((codes & 15, codes >> 4), -1).reshape(n, k // BK * p, BK).long().to(x.device)
    wq = cb[idx]  # [N, blocks, 128]
    part = torch.einsum("nbk,mbk->mnb", wq, xr.view(m, -1, BK))
    y = (part * w.scales[:, :n].T.unsqueeze(0)).sum(-1)
    if w.bias is not None:
        y = y + w.bias
    return y.to(x.dtype)


@dataclass
class ShippedLayout:
    """What the backend's kernel (``backends/turboquant_triton/decode_mma.py``) reads: the
    shipped prepared state as it is, the rotation of every pass, its workspace and counters."""

    prepared: Any
    rhs: Any
    workspace: torch.Tensor
    counters: torch.Tensor


def shipped_state(prepared: Any, rhs: Any, max_split: int = 16) -> ShippedLayout:
    """The backend kernel's call state over ``prepared`` (no copy of the weight)."""
    n = prepared.out_features
    dev = prepared.codebook.device
    return ShippedLayout(prepared, rhs, torch.empty(max_split * 8 * n, dtype=torch.float32, device=dev),
                         torch.zeros(shipped_layout.counters_size(n, 1), dtype=torch.int32, device=dev))


def shipped_decode(xr: torch.Tensor, s: ShippedLayout, split: int, tiles: int, copies: int, wide: bool = False,
                   xvec: bool = False) -> torch.Tensor:
    """The backend kernel's launch over the rotated input ``xr`` ``[M, P·K]`` (``wide``,
    ``xvec``: its options, ``decode_mma.mma_decode``)."""
    p = s.prepared
    out = torch.empty(xr.shape[0], p.out_features, dtype=xr.dtype, device=xr.device)
    return shipped_layout.mma_decode(xr, p.passes, p.codebook, p.bias, out, split=split, tiles=tiles, copies=copies,
                                     workspace=s.workspace, counters=s.counters, wide=wide, xvec=xvec)


def shipped_linear(x: torch.Tensor, s: ShippedLayout, split: int, tiles: int, copies: int, wide: bool = False,
                   xvec: bool = False) -> torch.Tensor:
    """``y = x·Ŵᵀ + b`` on the shipped layout: the rotation GEMM, then the backend's launch."""
    m = x.shape[0]
    xr = s.rhs(x.contiguous()).view(m, len(s.prepared.passes) * s.prepared.in_features)
    return shipped_decode(xr.to(x.dtype), s, split, tiles, copies, wide, xvec)


#: The backend kernel's variants the check runs ``(split, tiles, copies)``: split 3 runs past
#: the end of K = 1408 (11 blocks a pass), split 1 stores without the workspace.
SHIPPED_CHECK = ((3, 1, 16), (3, 2, 32), (1, 2, 32), (8, 2, 32))
#: Each option pair ``(wide, xvec)`` other than the shipped (0, 0) runs these of them.
OPTION_CHECK = ((3, 2, 32), (3, 1, 16))


def _options_name(wide: bool, xvec: bool) -> str:
    return (" wide" if wide else "") + (" xvec" if xvec else "")


# --- compile report ------------------------------------------------------------------------


def compile_report(*, fp16: bool = False, groups: int = 1, steps: int = 8, copies: int = 16,
                   tiles: int = 1) -> dict[str, Any]:
    """Compile for sm_90a on any machine: registers, spill stack, shared memory (Triton's
    and the static table), and the walk's opcode counts (two steps of every K-group) per
    code a thread handles there."""
    from quantcore.triton.compile_report import (
        backward_loops,
        compile_sm90,
        instructions,
        occupancy_sm90,
        opcode_counts,
        opcodes_in,
    )

    act = "fp16" if fp16 else "bf16"
    sig = {"w_ptr": "*i16", "x_ptr": f"*{act}", "s_ptr": "*fp32", "cb_ptr": "*fp32", "b_ptr": "*fp32",
           "y_ptr": f"*{act}", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32",
           "stride_xm": "i32", "stride_ym": "i32", "NP": "i32", "blocks": "i32", "split_k": "i32"}
    const = dict(HAS_BIAS=False, SPLIT=True, EVEN_K=True, KW=groups, STEPS=steps, COPIES=copies, TILES=tiles)
    compiled = compile_sm90(tq_decode_kernel, sig, const, divisible=[a for a in sig if a != "M"],
                            options={"num_warps": 4 * groups * tiles}, gluon=True)
    ins = instructions(compiled.sass)
    walk = max(backward_loops(ins), key=lambda span: len(opcodes_in(ins, span)))
    counts = opcode_counts(opcodes_in(ins, walk))
    codes = 2 * 64 * BK / 128  # a trip: two steps of 64 rows × 128 inputs over one group's 128 threads
    return {"fp16": fp16, "groups": groups, "steps": steps, "copies": copies, "tiles": tiles,
            "registers": compiled.registers, "spill_stack": compiled.spill_stack, "shared": compiled.shared,
            "table": 256 * 4 * copies,
            "blocks_per_sm": occupancy_sm90(compiled.registers, 4 * groups * tiles, compiled.shared + 256 * 4 * copies),
            "walk": dict(counts), "per_code": round(sum(counts.values()) / codes, 2),
            "lds_per_code": round(counts.get("LDS", 0) / codes, 3)}


# --- GPU check and timing ------------------------------------------------------------------


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


def _layer(k: int, n: int, passes: int, dtype: torch.dtype, sets: int, bias: bool = False) -> tuple[Any, ...]:
    """``sets`` quantized layers (one quantization, fresh random indices per set), the
    shipped kernel's prepared states and this kernel's."""
    from quantcore.backends.turboquant_triton.kernel import TurboQuantTriton
    from quantcore.formats.turboquant import TurboQuant

    from .turboquant_paths import _weights

    fmt = TurboQuant(bits=4, group_size=BK, residual=passes == 2)
    weights = _weights(fmt, k, n, sets, DEVICE)
    if bias:
        for w in weights:
            w["bias"] = torch.randn(n, device=DEVICE) * 0.1
    kernel = TurboQuantTriton(fmt, DEVICE)
    shipped = [kernel.prepare(w, dtype=dtype) for w in weights]
    mine = [prepare(s) for s in shipped]
    return fmt, weights, kernel, shipped, mine, [shipped_state(s, w.rhs) for s, w in zip(shipped, mine, strict=True)]


#: The check's layers ``(K, N, passes, bias)`` and variants ``(split, groups, copies, pdl, tiles)``:
#: K = 1408 is 11 groups (a split of 3 or 4 runs past the end), N = 1000 ends inside a tile.
CHECK_LAYERS = ((4096, 4096, 1, False), (4096, 4096, 2, True), (1408, 1000, 1, True), (1408, 1000, 2, False))
CHECK_MORE = ((1, 1, 16, False, 1), (3, 1, 32, False, 1), (3, 2, 16, False, 1), (3, 1, 16, True, 1))


def check(dtype: torch.dtype, tiles: Sequence[int] = (1,), more: bool = True,
          options: Sequence[tuple[bool, bool]] = ((False, False),), ms: Sequence[int] = (1, 3, 8)
          ) -> list[dict[str, Any]]:
    """Variants against the float64 golden, the emulation (:func:`emulate`) and their own
    second call; the shipped call's error beside them (bf16). Each of ``tiles`` above 1 on
    every layer (32 copies, split 3); ``more``: the fragment-order kernel's other variants.
    The backend's kernel on the shipped layout (:data:`SHIPPED_CHECK`) against the golden,
    its own emulation (``decode_mma.emulate``) and its second call; each of ``options``
    (``(wide, xvec)``, the shipped pair excepted) at :data:`OPTION_CHECK` (bf16); rows ``ms``."""
    rows: list[dict[str, Any]] = []
    fp16 = dtype == torch.float16
    for k, n, passes, bias in CHECK_LAYERS:
        if fp16 and (k, passes) not in ((4096, 2), (1408, 1)):
            continue
        fmt, weights, kernel, shipped, mine, layout = _layer(k, n, passes, dtype, 1, bias)
        golden_w = fmt.dequantize(weights[0])
        variants = ((3, 1, 16, False, 1),) + (CHECK_MORE if (k, passes) == (4096, 2) and not fp16 and more else ())
        variants += tuple((3, 1, 32, False, t) for t in tiles if t > 1)
        for m in ms:
            x = torch.randn(m, k, device=DEVICE, dtype=dtype)
            golden = x.double() @ golden_w.T
            if bias:
                golden += weights[0]["bias"].double()
            emu = emulate(x, mine[0])
            base = {"k": k, "n": n, "m": m, "passes": passes, "bias": bias, "dtype": str(dtype)}
            if not fp16 and (m == 1 or (m == 8 and k == 4096)):
                rows.append({**base, "variant": "shipped", "rel_err_golden": _rel(kernel(x, shipped[0]), golden)})
            rows.append({**base, "variant": "emulation", "rel_err_golden": _rel(emu, golden)})
            for split, groups, copies, pdl, t in variants:
                name = (f"mma split {split} groups {groups} copies {copies}" + (" pdl" if pdl else "")
                        + (f" tiles {t}" if t > 1 else ""))
                try:
                    got = linear(x, mine[0], split, groups, copies, pdl, t)
                    again = linear(x, mine[0], split, groups, copies, pdl, t)
                except Exception as exc:
                    rows.append({**base, "variant": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
                    continue
                rows.append({**base, "variant": name, "rel_err_golden": _rel(got, golden),
                             "rel_err_emulation": _rel(got, emu.double()),
                             "repeat_identical": bool(torch.equal(got, again))})
            st = layout[0]
            xr = st.rhs(x.contiguous()).view(m, passes * k).to(dtype)
            runs = [(sp, t, c, False, False) for sp, t, c in SHIPPED_CHECK]
            runs += [(sp, t, c, w, v) for w, v in options if (w or v) and not fp16 for sp, t, c in OPTION_CHECK]
            emus: dict[tuple[bool, bool], torch.Tensor] = {}
            for split, t, copies, wide, xvec in runs:
                if (wide, xvec) not in emus:
                    emus[wide, xvec] = shipped_layout.emulate(xr, st.prepared.passes, st.prepared.codebook,
                                                              st.prepared.bias, dtype, wide=wide, xvec=xvec)
                emu_s = emus[wide, xvec]
                name = f"shipped layout split {split} tiles {t} copies {copies}" + _options_name(wide, xvec)
                try:
                    got = shipped_linear(x, st, split, t, copies, wide, xvec)
                    again = shipped_linear(x, st, split, t, copies, wide, xvec)
                except Exception as exc:
                    rows.append({**base, "variant": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
                    continue
                rows.append({**base, "variant": name, "rel_err_golden": _rel(got, golden),
                             "rel_err_emulation": _rel(got, emu_s.double()),
                             "repeat_identical": bool(torch.equal(got, again)),
                             "counters_zero": bool((st.counters == 0).all())})
    return rows


def _time_layer(k: int, n: int, m: int, passes: int, layer: tuple[Any, ...],
                variants: Sequence[tuple[int, int, bool, int]], rounds: int,
                new_variants: Sequence[tuple[int, int, int, bool, bool]] = ()) -> list[dict[str, Any]]:
    """One layer and M: each variant checked (golden, twice the same), then all timed together."""
    from quantcore.timing import time_interleaved

    from .probe_rows import record_times

    kernel, shipped, mine, dense, golden_w, layout = layer
    sets = len(mine)
    dtype = torch.bfloat16
    xs = [torch.randn(m, k, device=DEVICE, dtype=dtype) for _ in range(sets)]
    golden = xs[0].double() @ golden_w.T
    names = ["shipped", "cuBLAS bf16"]
    calls: list[Any] = [lambda i: kernel(xs[i % sets], shipped[i % sets]),
                        lambda i: torch.nn.functional.linear(xs[i % sets], dense[i % len(dense)])]
    nsets = [sets, len(dense)]
    where = {"k": k, "n": n, "m": m, "passes": passes}
    rows = [{**where, "variant": "shipped", "rel_err_golden": _rel(kernel(xs[0], shipped[0]), golden)}]
    xr = [w.rhs(x).view(m, passes * k) for w, x in zip(mine, xs, strict=True)]
    for split, copies, pdl, tiles in variants:
        name = f"mma split {split} copies {copies}" + (" pdl" if pdl else "") + (f" tiles {tiles}" if tiles > 1 else "")
        try:
            got = linear(xs[0], mine[0], split, 1, copies, pdl, tiles)
            again = linear(xs[0], mine[0], split, 1, copies, pdl, tiles)
        except Exception as exc:
            rows.append({**where, "variant": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
            continue
        rows.append({**where, "variant": name, "rel_err_golden": _rel(got, golden),
                     "repeat_identical": bool(torch.equal(got, again))})
        names.append(name)
        calls.append(lambda i, s=split, c=copies, d=pdl, t=tiles: linear(xs[i % sets], mine[i % sets], s, 1, c, d, t))
        nsets.append(sets)
        if copies == 16 and not pdl and tiles == 1:
            names.append(name + " decode alone")
            calls.append(lambda i, s=split: decode(xr[i % sets], mine[i % sets], s, 1, 16))
            nsets.append(sets)
    for split, t, copies, wide, xvec in new_variants:
        name = f"shipped layout split {split} tiles {t} copies {copies}" + _options_name(wide, xvec)
        try:
            got = shipped_linear(xs[0], layout[0], split, t, copies, wide, xvec)
            again = shipped_linear(xs[0], layout[0], split, t, copies, wide, xvec)
        except Exception as exc:
            rows.append({**where, "variant": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
            continue
        rows.append({**where, "variant": name, "rel_err_golden": _rel(got, golden),
                     "repeat_identical": bool(torch.equal(got, again))})
        names.append(name)
        calls.append(lambda i, s=split, t=t, c=copies, w=wide, v=xvec: shipped_linear(xs[i % sets], layout[i % sets],
                                                                                      s, t, c, w, v))
        nsets.append(sets)
        names.append(name + " decode alone")
        calls.append(lambda i, s=split, t=t, c=copies, w=wide, v=xvec: shipped_decode(xr[i % sets], layout[i % sets],
                                                                                      s, t, c, w, v))
        nsets.append(sets)
    times = time_interleaved(calls, DEVICE, rounds=rounds, graph=True, sets=nsets)
    record_times(rows, names, times, where)
    for r in rows:
        if "us" in r:
            print(f"{k}x{n} P{passes} M{m} {r['variant']:46s} {r['us']:8.2f} us {r['x_cublas']:5.2f}x "
                  f"err {r.get('rel_err_golden', float('nan')):.1e} same {r.get('repeat_identical', '-')}", flush=True)
    return rows


def timing(shapes: Sequence[tuple[int, int]], passes_list: Sequence[int], ms: Sequence[int], splits: Sequence[int],
           rounds: int, save: Callable[[list[dict[str, Any]]], None], deadline: float,
           tiles: Sequence[int] = (1,), lean: bool = False,
           options: Sequence[tuple[bool, bool]] = ((False, False),)) -> list[dict[str, Any]]:
    """CUDA-graph replays over weight sets larger than L2 (bf16): the shipped call, cuBLAS,
    and per split this kernel with the rotation before it (its decode launch alone beside
    it), with 32 table copies at the first split and with programmatic dependent launch;
    each of ``tiles`` above 1 (row tiles a program, 32 copies) at every split; the backend's
    kernel on the shipped layout at every split and each of ``tiles`` (32 copies with two,
    16 with one), with and without the rotation. ``lean``: of this kernel only its runs
    at each split and tile count (no 32-copy one-tile or dependent-launch runs). ``options``:
    the ``(wide, xvec)`` pairs of the shipped-layout kernel timed.
    ``save`` gets the rows after each layer; no layer starts past ``deadline``."""
    from quantcore.benchmarks.memory import rotation_sets
    from quantcore.benchmarks.suites.turboquant_linear import format_bytes
    from quantcore.formats.turboquant import TurboQuant

    dtype = torch.bfloat16
    rows: list[dict[str, Any]] = []
    variants = [(s, 16, False, 1) for s in splits] + [(s, 32, False, t) for t in tiles if t > 1 for s in splits]
    if not lean:
        variants += [(splits[0], 32, False, 1)] + [(s, 16, True, 1) for s in splits]
    new_variants = [(s, t, 32 if t > 1 else 16, w, v) for w, v in options for t in tiles for s in splits]
    for k, n in shapes:
        dense = [torch.randn(n, k, device=DEVICE, dtype=dtype) * 0.02 for _ in range(rotation_sets(2 * k * n, DEVICE))]
        for passes in passes_list:
            if time.monotonic() > deadline:
                rows.append({"k": k, "n": n, "passes": passes, "variant": "-", "error": "not run: out of time"})
                continue
            fmt = TurboQuant(bits=4, group_size=BK, residual=passes == 2)
            sets = rotation_sets(format_bytes(fmt, 1, k, n), DEVICE)
            fmt, weights, kernel, shipped, mine, layout = _layer(k, n, passes, dtype, sets)
            golden_w = fmt.dequantize(weights[0])
            for m in ms:
                rows += _time_layer(k, n, m, passes, (kernel, shipped, mine, dense, golden_w, layout), variants, rounds,
                                    new_variants)
            save(rows)
    return rows


def _report_all() -> list[dict[str, Any]]:
    out = []
    for kw in (dict(), dict(copies=32), dict(fp16=True), dict(groups=2), dict(steps=28), dict(tiles=2, copies=32),
               dict(tiles=2), dict(tiles=4, copies=32)):
        r = compile_report(**kw)  # type: ignore[arg-type]
        print(json.dumps(r), flush=True)
        out.append(r)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", action="store_true", help="compile for sm_90a only (any machine)")
    p.add_argument("--shapes", default="4096x14336,14336x4096,4096x4096")
    p.add_argument("--passes", default="1,2")
    p.add_argument("--ms", default="1")
    p.add_argument("--splits", default="4,8,16")
    p.add_argument("--tiles", default="1", help="row tiles a program; each above 1 timed with 32 copies")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--check-ms", default="1,3,8", help="rows of the check")
    p.add_argument("--check-dtypes", default="bf16,fp16", help="activation dtypes of the check")
    p.add_argument("--lean", action="store_true", help="of the fragment-order kernel only its base variants")
    p.add_argument("--wide", default="0", help="shipped-layout kernel: 0 one group a step, 1 two (a 128-byte line)")
    p.add_argument("--xvec", default="0", help="shipped-layout kernel: 0 x staged by 4-byte gathers, 1 16-byte loads")
    p.add_argument("--budget", type=float, default=200.0, help="seconds after which no new layer is timed")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    deadline = time.monotonic() + a.budget
    res: dict[str, Any] = {}

    def save(timing_rows: list[dict[str, Any]] | None = None) -> None:
        if timing_rows is not None:
            res["timing"] = timing_rows
        if a.json:
            a.json.write_text(json.dumps(res, indent=1))

    if a.report:
        res["compile"] = _report_all()
        res["compile_shipped_layout"] = []
        for f in (False, True):
            for passes in (1, 2):
                for t, c in ((2, 32), (1, 16)):
                    r = shipped_layout.compile_report(fp16=f, passes=passes, tiles=t, copies=c)
                    print(json.dumps(r), flush=True)
                    res["compile_shipped_layout"].append(r)
        # Its options at the same groups a program (a wide step is two groups: half the steps).
        for passes in (1, 2):
            for t, c in ((2, 32), (1, 16)):
                for wide, xvec in ((True, False), (False, True), (True, True)):
                    r = shipped_layout.compile_report(passes=passes, tiles=t, copies=c, wide=wide, xvec=xvec,
                                                      steps=4 if wide else 8)
                    print(json.dumps(r), flush=True)
                    res["compile_shipped_layout"].append(r)
        save()
        return
    import triton

    res |= {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    torch.manual_seed(0)
    tiles = [int(v) for v in a.tiles.split(",")]
    options = [(bool(int(w)), bool(int(v))) for w in a.wide.split(",") for v in a.xvec.split(",")]
    if not a.no_check:
        res["check"] = []
        for dtype in [{"bf16": torch.bfloat16, "fp16": torch.float16}[d] for d in a.check_dtypes.split(",")]:
            for r in check(dtype, tiles, more=not a.lean, options=options,
                           ms=[int(v) for v in a.check_ms.split(",")]):
                res["check"].append(r)
                print(json.dumps(r), flush=True)
        save()
    shapes = [(int(s.split("x")[0]), int(s.split("x")[1])) for s in a.shapes.split(",")]
    timing(shapes, [int(v) for v in a.passes.split(",")], [int(v) for v in a.ms.split(",")],
           [int(v) for v in a.splits.split(",")], a.rounds, save, deadline, tiles, a.lean, options)


if __name__ == "__main__":
    main()
