"""Device helpers shared by the TurboQuant Triton kernels: the codebook lookup, the split
of a rotated activation into the eight nibble planes of a packed word, the output rounding.

Index words. A row of indices is read as int32 words: word i of a row holds the 4-bit
indices of coordinates 8i … 8i+7, coordinate 8i+k in nibble k (bits 4k … 4k+3) — the
stored byte layout (coordinate 2j low nibble of byte j) read little-endian. A kernel
therefore multiplies nibble plane k of a word tile with ``x_rot[8i + k]``, the natural
coordinate order (``split_halves=False``).

Codebook lookup on the GPU. The 16 centroids live in a 64-byte table in shared memory
that inline PTX declares and fills (``codebook_table``); a lookup is one ``LDS`` at
``table + 4·index`` — 16 words in 16 banks, so a warp's 32 random lookups are
conflict-free. The table is declared 1 KB long and 1 KB aligned although it uses 64
bytes: static shared memory comes first in the block's window, and Triton's dynamic
buffers after it must stay 1024-byte aligned, since wgmma's swizzled operand layouts
are read by address bits (a 64-byte table shifted them and the tensor-core kernel
returned garbage on the H100). A kernel whose own dynamic shared memory is in
(47 KB, 48 KB] cannot launch beside the table (Triton raises the opt-in limit only above
48 KB); ``tests/turboquant/test_sm90_compile.py`` keeps the selectable configs out of it. The byte offsets ``4·index`` of all eight nibbles of a word come from two
masks and one byte permute each::

    t = (w << 2) & 0x3C3C3C3C     byte j of t = 4 × low nibble of byte j  (k = 2j)
    u = (w >> 2) & 0x3C3C3C3C     byte j of u = 4 × high nibble of byte j (k = 2j + 1)
    offset_k = prmt(t or u, byte j)

That is about 3.4 instructions per weight including the FMA (SASS of the sm_90 build),
against 6.6 for a lookup through L1 with 64-bit addresses. Triton has no shared-memory
tensor in its language, hence the PTX; the table is a function-scope ``.shared`` array,
separate from Triton's own (dynamic) shared memory.

Under the interpreter (CPU) there is no PTX: the same planes come from plain loads of the
codebook, so the interpreter checks everything but the two asm helpers, which the CUDA
conformance run covers.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantcore.triton.interpreter import serialize_launches

serialize_launches()  # the interpreter's launches share module state: one at a time

__all__ = ["codebook_table", "group_centroids", "nibble_values", "rotated_planes", "rounded", "to_output"]


@triton.jit
def codebook_table(cb_ptr, INTERPRET: tl.constexpr):
    """Declare the shared codebook table and fill it (threads 0-15, one centroid each);
    the caller places a barrier before the first lookup. A no-op under the interpreter."""
    if not INTERPRET:
        tl.inline_asm_elementwise(
            """.shared .align 1024 .b8 qc_codebook[1024];
            { .reg .pred p; .reg .u32 t, s; .reg .u64 a; .reg .b32 v;
              mov.u32 t, %tid.x; setp.lt.u32 p, t, 16;
              mad.wide.u32 a, t, 4, $1;
              @p ld.global.nc.b32 v, [a];
              mov.u32 s, qc_codebook; mad.lo.u32 s, t, 4, s;
              @p st.shared.b32 [s], v;
              mov.u32 $0, 0; }""",
            "=r,l", [cb_ptr], dtype=tl.int32, is_pure=False, pack=1,
        )


@triton.jit
def _lds(offset):
    return tl.inline_asm_elementwise(
        "{ .reg .u32 s; mov.u32 s, qc_codebook; add.u32 s, s, $1; ld.shared.f32 $0, [s]; }",
        "=r,r", [offset], dtype=tl.float32, is_pure=True, pack=1,
    )


@triton.jit
def _byte_offset(t, J: tl.constexpr):
    """Byte J of ``t`` as a 32-bit value (one PRMT)."""
    if J == 0:
        r = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x4440;", "=r,r", [t], dtype=tl.uint32, is_pure=True, pack=1)
    elif J == 1:
        r = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x4441;", "=r,r", [t], dtype=tl.uint32, is_pure=True, pack=1)
    elif J == 2:
        r = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x4442;", "=r,r", [t], dtype=tl.uint32, is_pure=True, pack=1)
    else:
        r = t >> 24
    return r


@triton.jit
def nibble_values(w, cb_ptr, INTERPRET: tl.constexpr):
    """The centroids of the eight nibbles of every word in ``w`` (uint32): eight fp32
    tensors of w's shape, plane k for coordinate 8i + k."""
    if INTERPRET:
        v0 = tl.load(cb_ptr + (w & 15))
        v1 = tl.load(cb_ptr + ((w >> 4) & 15))
        v2 = tl.load(cb_ptr + ((w >> 8) & 15))
        v3 = tl.load(cb_ptr + ((w >> 12) & 15))
        v4 = tl.load(cb_ptr + ((w >> 16) & 15))
        v5 = tl.load(cb_ptr + ((w >> 20) & 15))
        v6 = tl.load(cb_ptr + ((w >> 24) & 15))
        v7 = tl.load(cb_ptr + ((w >> 28) & 15))
    else:
        t = (w << 2) & 0x3C3C3C3C
        u = (w >> 2) & 0x3C3C3C3C
        v0 = _lds(_byte_offset(t, 0))
        v1 = _lds(_byte_offset(u, 0))
        v2 = _lds(_byte_offset(t, 1))
        v3 = _lds(_byte_offset(u, 1))
        v4 = _lds(_byte_offset(t, 2))
        v5 = _lds(_byte_offset(u, 2))
        v6 = _lds(_byte_offset(t, 3))
        v7 = _lds(_byte_offset(u, 3))
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def group_centroids(idx_ptr, rows, rmask, g, stride_idx, cb_ptr, WPG: tl.constexpr, D: tl.constexpr,
                   BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr):
    """Ŵ_g without its scale: [BLOCK_N, D] fp32 centroids in natural coordinate order
    (rows outside ``rmask`` read index 0; their scale is 0)."""
    wcols = tl.arange(0, WPG)
    w = tl.load(idx_ptr + rows[:, None].to(tl.int64) * stride_idx + g * WPG + wcols[None, :],
                mask=rmask[:, None], other=0, eviction_policy="evict_first").to(tl.uint32, bitcast=True)
    v0, v1, v2, v3, v4, v5, v6, v7 = nibble_values(w, cb_ptr, INTERPRET)
    even = tl.reshape(tl.join(tl.join(v0, v4), tl.join(v2, v6)), [BLOCK_N, WPG, 4])  # k = 0, 2, 4, 6
    odd = tl.reshape(tl.join(tl.join(v1, v5), tl.join(v3, v7)), [BLOCK_N, WPG, 4])   # k = 1, 3, 5, 7
    return tl.reshape(tl.join(even, odd), [BLOCK_N, D])


@triton.jit
def rotated_planes(xr, ROWS: tl.constexpr, WORDS: tl.constexpr):
    """``xr`` [ROWS, 8·WORDS] (rotated coordinates, natural order) → eight [ROWS, WORDS]
    tensors, plane k holding coordinates 8i + k."""
    a = tl.reshape(xr, [ROWS, WORDS, 4, 2])
    even, odd = tl.split(a)  # k = 2q, k = 2q + 1
    e = tl.reshape(even, [ROWS, WORDS, 2, 2])
    o = tl.reshape(odd, [ROWS, WORDS, 2, 2])
    e0, e1 = tl.split(e)  # k = 0, 4 | 2, 6
    o0, o1 = tl.split(o)  # k = 1, 5 | 3, 7
    p0, p4 = tl.split(e0)
    p2, p6 = tl.split(e1)
    p1, p5 = tl.split(o0)
    p3, p7 = tl.split(o1)
    return p0, p1, p2, p3, p4, p5, p6, p7


@triton.jit
def rounded(acc, dtype: tl.constexpr):
    """``acc`` (fp32) in ``dtype``, rounded to nearest even. For bf16 the rounding is done
    on the bits: the interpreter's own fp32 → bf16 conversion truncates, and the explicit
    form is exact on the GPU as well (the result is then representable)."""
    if dtype == tl.bfloat16:
        bits = acc.to(tl.uint32, bitcast=True)
        nearest = ((bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000).to(tl.float32, bitcast=True)
        # A NaN keeps its own conversion: the GPU's NaN is 0x7FFFFFFF, whose rounding
        # carry runs into the sign bit and would write -0.0 (found by the H100 fuzz).
        acc = tl.where(acc != acc, acc, nearest)
    return acc.to(dtype)


@triton.jit
def to_output(acc, out_ptr):
    """``acc`` (fp32) in the output dtype, rounded to nearest even (:func:`rounded`)."""
    return rounded(acc, out_ptr.dtype.element_ty)
