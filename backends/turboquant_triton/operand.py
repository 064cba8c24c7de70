"""The tensor-core kernel's weight operand made in the register layout the matrix unit
reads (``MmaConfig.register_operand``), instead of through shared memory.

Why. ``lookup.group_centroids`` looks up the eight nibbles of each index word and
interleaves the eight planes back into the natural coordinate order with ``join`` and
``reshape``. The tile it makes, [BLOCK_N, d], has a layout of its own, so Triton converts
it to the operand layout through shared memory: per weight 2 bytes stored (STS) and 2
read back (LDSM), two barriers a group, beside the 4-byte codebook lookup — the
shared-memory traffic of a weight more than doubles (``README.md``, "Tensor-core kernel
at M = 16").

How. A register of the 16-bit operand holds two weights of one row at consecutive
positions of the dot's K, the lower position in the low half. Read as int16, element
``e`` of a group's row of index words holds coordinates ``4e … 4e+3`` (nibble i:
coordinate ``4e + i``), and two consecutive elements are one stored word. So quarter ``i``
of the operand, [BLOCK_N, d/4], takes nibble i of every element — the weights of
coordinates ``4e + i`` — and is elementwise in the int16 tile: one inline-PTX block per
stored word (``pack=2``) turns nibble i of both halves into the pair of centroids in the
activation dtype, and Triton loads the codes into the operand layout directly
(``ldmatrix``). The four quarters side by side, position ``(d/4)·i + e``, are one dot of
K = d: each element sits at the same offset modulo 16 as in its quarter, so the thread
that made it already holds it there and the concatenation costs no data movement.

The activation must then come in the same order: position ``(d/4)·i + e`` of a group
holds ``x_rot`` at coordinate ``4e + i`` (:func:`coordinate_order`). The rotation writes
it so: the GEMM outside with the rotation's columns permuted once per layer (the same
dot products, other columns), the in-kernel and once-per-call rotations with Πᵀ's rows
loaded in that order or their results stored in it. The sum over a group runs in
another order than the natural-order dot's; everything else — the lookup, the rounding
of a centroid to the activation dtype, the scale on the group's result — is the same
arithmetic.

Needs d/4 a multiple of 16 (quarters on whole K steps of the matrix unit, else the
concatenation moves data): d ≥ 64; below, and for float32 operands on a GPU, the kernel
keeps the shared-memory operand.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantcore.triton.interpreter import serialize_launches

from .lookup import rounded

serialize_launches()  # the interpreter's launches share module state: one at a time

__all__ = ["MIN_GROUP", "codes16", "coordinate_order", "nibble_operand", "operand_order", "operand_position",
           "register_operand"]

#: The smallest group size with a register operand (a dot's K of 16 is d/4).
MIN_GROUP = 64


def coordinate_order(d: int) -> torch.Tensor:
    """The coordinate at each position of a group of the register operand's activation:
    position ``(d/4)·i + e`` holds coordinate ``4e + i`` (int64 [d])."""
    q = d // 4
    pos = torch.arange(d)
    return 4 * (pos % q) + pos // q


def _lookup_asm(i: int, half: str, scaled: bool = False) -> str:
    """PTX: nibble ``i`` of both int16 halves of ``$1`` looked up in the shared codebook
    (``lookup.codebook_table``) → the pair in ``half`` (``bf16`` / ``f16``), low half from
    the low int16; with ``scaled`` each centroid times its float32 scale (``$2`` low, ``$3``
    high) first, the product rounded once. ``t`` holds 4 × the low (i even) or high (i
    odd) nibble of every byte: the byte offsets of their centroids; nibble i sits in byte
    i // 2 of each half."""
    shift = "shl.b32 t, $1, 2;" if i % 2 == 0 else "shr.u32 t, $1, 2;"
    lo, hi = i // 2, i // 2 + 2
    return ("{ .reg .b32 t, a, b, s; .reg .f32 fa, fb; " + shift + " and.b32 t, t, 0x3C3C3C3C;"
            f" prmt.b32 a, t, 0, 0x444{lo}; prmt.b32 b, t, 0, 0x444{hi};"
            " mov.u32 s, qc_codebook; add.u32 a, a, s; add.u32 b, b, s;"
            " ld.shared.f32 fa, [a]; ld.shared.f32 fb, [b];"
            + (" mul.rn.f32 fa, fa, $2; mul.rn.f32 fb, fb, $3;" if scaled else "")
            + f" cvt.rn.{half}x2.f32 $0, fb, fa; }}")


_ASM = tl.constexpr(tuple(_lookup_asm(i, half) for half in ("bf16", "f16") for i in range(4)))
_ASM_SCALED = tl.constexpr(tuple(_lookup_asm(i, half, True) for half in ("bf16", "f16") for i in range(4)))


@triton.jit
def codes16(idx_ptr, rows, rmask, g, stride_idx, D: tl.constexpr):
    """Group ``g``'s index words of ``rows`` read as int16, [BLOCK_N, d/4] (element e:
    coordinates 4e … 4e+3; ``stride_idx`` in int32 words; masked rows read 0)."""
    Q: tl.constexpr = D // 4
    idx16 = idx_ptr.to(tl.pointer_type(tl.int16))
    e = tl.arange(0, Q)
    return tl.load(idx16 + rows[:, None].to(tl.int64) * (2 * stride_idx) + g * (D // 4) + e[None, :],
                   mask=rmask[:, None], other=0, eviction_policy="evict_first")


@triton.jit
def nibble_operand(w16, cb_ptr, scale, NIB: tl.constexpr, dtype: tl.constexpr, SCALED: tl.constexpr,
                   DOT_FP32: tl.constexpr, INTERPRET: tl.constexpr):
    """Quarter ``NIB`` of the operand: the centroid of nibble NIB of every element of
    ``w16`` (the weight at coordinate 4e + NIB), [BLOCK_N, d/4], in ``dtype`` (float32 for
    an IEEE float32 dot, as ``mma._group_product`` makes it). With ``SCALED`` the centroid
    times its row's float32 ``scale`` ([BLOCK_N, 1]), rounded once to ``dtype`` to nearest
    even — on the GPU too, so under the interpreter (float32 dots) the product is rounded
    to ``dtype`` and widened back, the value the matrix unit multiplies."""
    if INTERPRET:
        v = tl.load(cb_ptr + ((w16.to(tl.int32) >> (4 * NIB)) & 15))
        if SCALED:
            v = rounded(v * scale, dtype)
            if DOT_FP32:
                v = v.to(tl.float32)
        elif not DOT_FP32:
            v = v.to(dtype)
    elif SCALED:  # pack=2: one int16 pair (one register) and its two float32 scales (two)
        if dtype == tl.float16:
            v = tl.inline_asm_elementwise(_ASM_SCALED[4 + NIB], "=r,r,f,f", [w16, scale], dtype=tl.float16,
                                          is_pure=True, pack=2)
        else:
            v = tl.inline_asm_elementwise(_ASM_SCALED[NIB], "=r,r,f,f", [w16, scale], dtype=tl.bfloat16,
                                          is_pure=True, pack=2)
    elif dtype == tl.float16:
        v = tl.inline_asm_elementwise(_ASM[4 + NIB], "=r,r", [w16], dtype=tl.float16, is_pure=True, pack=2)
    else:
        v = tl.inline_asm_elementwise(_ASM[NIB], "=r,r", [w16], dtype=tl.bfloat16, is_pure=True, pack=2)
    return v


@triton.jit
def register_operand(idx_ptr, rows, rmask, g, stride_idx, cb_ptr, scale, dtype: tl.constexpr, D: tl.constexpr,
                     BLOCK_N: tl.constexpr, SCALED: tl.constexpr, DOT_FP32: tl.constexpr, INTERPRET: tl.constexpr):
    """Ŵ_g without its scale, [BLOCK_N, d] in ``dtype`` (float32 for an IEEE float32 dot),
    its columns in the register operand's order (:func:`coordinate_order`); with
    ``SCALED``, ŵ = centroid · ``scale`` ([BLOCK_N, 1] float32, one per row; unused
    without) rounded once to ``dtype`` (:func:`nibble_operand`)."""
    w16 = codes16(idx_ptr, rows, rmask, g, stride_idx, D)
    s = scale
    a0 = nibble_operand(w16, cb_ptr, s, 0, dtype, SCALED, DOT_FP32, INTERPRET)
    a1 = nibble_operand(w16, cb_ptr, s, 1, dtype, SCALED, DOT_FP32, INTERPRET)
    a2 = nibble_operand(w16, cb_ptr, s, 2, dtype, SCALED, DOT_FP32, INTERPRET)
    a3 = nibble_operand(w16, cb_ptr, s, 3, dtype, SCALED, DOT_FP32, INTERPRET)
    # [n, e, a, b] = quarter 2a + b (join adds the minor dimension), moved to position
    # (d/4)·(2a + b) + e. Every quarter's element sits at the same offset modulo 16 of the
    # dot's K as in its quarter, so each thread already holds the elements of the operand
    # it made: the layout change is a renaming (no shared memory in the SASS).
    return tl.reshape(tl.permute(tl.join(tl.join(a0, a2), tl.join(a1, a3)), (0, 2, 3, 1)), [BLOCK_N, D])


@triton.jit
def operand_order(pos, D: tl.constexpr, REG_OPERAND: tl.constexpr):
    """The coordinate at positions ``pos`` of a group (:func:`coordinate_order`; the
    identity without ``REG_OPERAND``)."""
    if REG_OPERAND:
        return 4 * (pos % (D // 4)) + pos // (D // 4)
    return pos


@triton.jit
def operand_position(c, D: tl.constexpr):
    """The position of coordinate ``c`` in the register operand's order (the inverse of
    :func:`operand_order`)."""
    return (D // 4) * (c % 4) + c // 4
