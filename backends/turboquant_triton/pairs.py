"""Codebook lookups two weights at a time, for the decode kernel (``gemv.py``).

A byte of an index word holds two indices: coordinate 2j in its low nibble, 2j + 1 in its
high one (``lookup.py``). The pair table holds, for every byte value e, the two float32
centroids ``(c[e & 15], c[e >> 4])``: one 8-byte ``LDS.64`` looks both up. Per byte that
is a shift, one ``LOP3`` (mask and the lane's replica offset), the load and the two FMAs —
19 instructions per word of eight weights where the single-centroid table
(``lookup.nibble_values``) takes 26: two masks and a byte permute per index, one ``LDS``
each. The centroids are the same float32 values, so the products and their order are
the same: the kernel's output is bit for bit that of the single-centroid lookup.

Bank conflicts. Shared memory serves 128 bytes a cycle; a warp's 8-byte loads are served
as two halves of 16 lanes. 256 entries of 8 bytes in one copy would put two lanes of a
half on one bank pair whenever their bytes differ modulo 16. So the table is kept 16
times, entry e of copy r at ``e · 128 + r · 8``, and lane l reads copy ``l mod 16``: the
16 lanes of a half read 16 different bank pairs whatever their bytes — one wavefront per
half, as many bytes a cycle as the single-centroid lookup. 32 KB of static shared memory
(``PAIR_TABLE_BYTES``); beside Triton's own dynamic shared memory the kernel needs more than
48 KB a block, which :func:`quantcore.triton.launch.opt_in_shared` allows before its first
launch.

The copy a lane reads is computed from the word's column in the tile (``lane_offsets``):
the decode tile puts 4 consecutive words of a row on one thread and 32 threads along the
row, so column c sits on lane (c / 4) mod 32. Were the compiler to lay the tile out
otherwise, a lane would read another copy: the same values, more wavefronts.

Under the interpreter there is no PTX: the lookups are plain loads of the codebook.
"""

from __future__ import annotations

import triton
import triton.language as tl

from quantcore.triton.interpreter import serialize_launches

serialize_launches()  # the interpreter's launches share module state: one at a time

__all__ = ["PAIR_TABLE_BYTES", "lane_offsets", "pair_table", "pair_values"]

#: 256 byte values × 16 copies × two float32 centroids.
PAIR_TABLE_BYTES = 256 * 16 * 8

_FILL_ROUND = """
  setp.lt.u32 p, e, 256;
  and.b32 lo, e, 15; shr.u32 hi, e, 4; and.b32 hi, hi, 15;
  mad.wide.u32 a, lo, 4, $1; @p ld.global.nc.b32 vl, [a];
  mad.wide.u32 a, hi, 4, $1; @p ld.global.nc.b32 vh, [a];
  mov.u32 s, qc_pairs; mad.lo.u32 s, e, 128, s;""" + "".join(
    f"\n  @p st.shared.v4.b32 [s+{16 * i}], {{vl, vh, vl, vh}};" for i in range(8)) + "\n  add.u32 e, e, n;"
#: Declares the table and fills it in two rounds of the block's threads.
_FILL = tl.constexpr(
    ".shared .align 1024 .b8 qc_pairs[32768];\n"
    "{ .reg .pred p; .reg .u32 e, n, lo, hi, s; .reg .u64 a; .reg .b32 vl, vh;\n"
    "  mov.u32 e, %tid.x; mov.u32 n, %ntid.x;" + _FILL_ROUND + _FILL_ROUND + "\n  mov.u32 $0, 0; }")


#: One word's eight centroids: the lane's copy offset once, then per byte its offset
#: (moved to bits 7-14, masked, the copy's offset in bits 3-6 or-ed in) plus the table's
#: address, and one 8-byte load.
_WORD = tl.constexpr(
    "{ .reg .u32 o, l, b; mov.u32 l, %laneid; and.b32 l, l, 15; shl.b32 l, l, 3; mov.u32 b, qc_pairs;"
    " shl.b32 o, $8, 7; and.b32 o, o, 0x7F80; or.b32 o, o, l; add.u32 o, o, b; ld.shared.v2.f32 {$0, $1}, [o];"
    " and.b32 o, $8, 0xFF00; shr.u32 o, o, 1; or.b32 o, o, l; add.u32 o, o, b; ld.shared.v2.f32 {$2, $3}, [o];"
    " shr.u32 o, $8, 9; and.b32 o, o, 0x7F80; or.b32 o, o, l; add.u32 o, o, b; ld.shared.v2.f32 {$4, $5}, [o];"
    " shr.u32 o, $8, 17; and.b32 o, o, 0x7F80; or.b32 o, o, l; add.u32 o, o, b; ld.shared.v2.f32 {$6, $7}, [o]; }")


@triton.jit
def pair_table(cb_ptr, INTERPRET: tl.constexpr):
    """Declare the pair table and fill it: thread t writes entries t and t + (threads in the
    block), every copy of each (at least 128 threads: 4 warps). The caller places a
    barrier before the first lookup. A no-op under the interpreter."""
    if not INTERPRET:
        tl.inline_asm_elementwise(_FILL, "=r,l", [cb_ptr], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def lane_offsets(cols):
    """The byte offset of the table copy each column's lane reads: 8 · ((c / 4) mod 16)."""
    return ((cols // 4) % 16) * 8


@triton.jit
def pair_values(w, lane8, cb_ptr, INTERPRET: tl.constexpr):
    """The centroids of the eight nibbles of every word in ``w`` (uint32), plane k for
    coordinate 8i + k, as ``lookup.nibble_values`` returns them; ``lane8`` is
    :func:`lane_offsets` of the words' columns, broadcast to ``w``'s shape."""
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
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _WORD, "=r,=r,=r,=r,=r,=r,=r,=r,r", [w], dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    return v0, v1, v2, v3, v4, v5, v6, v7
