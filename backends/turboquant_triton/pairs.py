"""Codebook lookups two weights at a time, for the decode kernel (``gemv.py``).

A byte of an index word holds two indices: coordinate 2j in its low nibble, 2j + 1 in its
high one (``lookup.py``). A pair table holds, for every byte value e, the two centroids
``(c[e & 15], c[e >> 4])``, so one shared-memory load looks both up. Per byte that is a
shift, one ``LOP3`` (mask and the lane's copy offset), the load and the two FMAs, where the
single-centroid table (``lookup.nibble_values``) takes two masks and a byte permute per
index and one ``LDS`` each. Two tables (``LOOKUP`` in the kernel, ``GemvConfig.lookup``):

* ``PAIRS`` — float32 pairs, one 8-byte ``LDS.64``. The same float32 centroids as the single
  lookup, the same products in the same order: the output is bit for bit the single
  lookup's. 256 entries × 16 copies × 8 bytes: lane l reads copy ``l mod 16`` at
  ``e · 128 + (l mod 16) · 8``, so the 16 lanes of a half-warp (how 8-byte loads are served)
  read 16 different bank pairs whatever their bytes. As many shared-memory bytes a weight
  (4) as the single lookup.
* ``HALF_PAIRS`` — the pair as two fp16 in one 4-byte ``LDS`` and two conversions to float32:
  half the shared-memory bytes a weight (2). 256 entries × 32 copies × 4 bytes: lane l reads
  copy l at ``e · 128 + l · 4``, one bank per lane. The centroids are rounded to fp16 once
  (relative error at most 2⁻¹¹ where they are normal fp16 numbers); a codebook with a value
  outside fp16's normal range never takes it (``half_codebook``).

Either table is 32 KB of static shared memory: beside the kernel's own shared memory the
block needs more than 48 KB, which ``quantcore/triton/static_shared.py`` allows before the
first launch. The copy a lane reads is taken from ``%laneid``, so it holds whatever layout
the compiler gives the word tile.

Under the interpreter there is no PTX: the lookups are plain loads of the codebook (rounded
through fp16 for ``HALF_PAIRS``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantcore.triton.interpreter import serialize_launches

serialize_launches()  # the interpreter's launches share module state: one at a time

__all__ = ["HALF_PAIRS", "PAIRS", "PAIR_TABLE_BYTES", "SINGLE", "half_codebook", "pair_table", "pair_values"]

#: The kernel's ``LOOKUP`` values.
SINGLE = 0
PAIRS = 1
HALF_PAIRS = 2
#: Either pair table: 256 byte values × 128 bytes of copies.
PAIR_TABLE_BYTES = 256 * 128


def _fill(table: str, entry: str) -> tl.constexpr:
    """Declare ``table`` and fill it in two rounds of the block's threads (at least 128):
    thread t writes entry t and t + threads, each entry 128 bytes of copies of ``v``, which
    ``entry`` makes from the two centroids ``fl`` and ``fh`` (float32)."""
    one_round = (
        "\n  setp.lt.u32 p, e, 256;"
        "\n  and.b32 lo, e, 15; shr.u32 hi, e, 4; and.b32 hi, hi, 15;"
        "\n  mad.wide.u32 a, lo, 4, $1; @p ld.global.nc.f32 fl, [a];"
        "\n  mad.wide.u32 a, hi, 4, $1; @p ld.global.nc.f32 fh, [a];"
        f"\n  {entry}"
        f"\n  mov.u32 s, {table}; mad.lo.u32 s, e, 128, s;"
        + "".join(f"\n  @p st.shared.v4.b32 [s+{16 * i}], {{v0, v1, v0, v1}};" for i in range(8))
        + "\n  add.u32 e, e, n;"
    )
    return tl.constexpr(
        f".shared .align 1024 .b8 {table}[32768];\n"
        "{ .reg .pred p; .reg .u32 e, n, lo, hi, s; .reg .u64 a; .reg .f32 fl, fh; .reg .b32 v0, v1;"
        " .reg .b16 hl, hh;\n  mov.u32 e, %tid.x; mov.u32 n, %ntid.x;" + one_round + one_round
        + "\n  mov.u32 $0, 0; }")


#: float32 pairs: v0, v1 = the two centroids (an 8-byte entry, twice per 16-byte store).
_FILL_PAIRS = _fill("qc_pairs", "mov.b32 v0, fl; mov.b32 v1, fh;")
#: fp16 pairs: v0 = v1 = both centroids rounded to fp16 (a 4-byte entry, four per store).
_FILL_HALF = _fill("qc_pairs16", "cvt.rn.f16.f32 hl, fl; cvt.rn.f16.f32 hh, fh; mov.b32 v0, {hl, hh}; mov.b32 v1, v0;")

_SHIFTS = ("shl.b32 o, $8, 7;", "shr.u32 o, $8, 1;", "shr.u32 o, $8, 9;", "shr.u32 o, $8, 17;")


def _word(table: str, copy: str, load: str) -> tl.constexpr:
    """One word's eight centroids: the lane's copy offset (``copy``: into ``l``) once, then
    per byte its offset (moved to bits 7-14, masked, the copy's or-ed in) plus the table's
    address and ``load`` (``{j}``: the byte, its two results ``$2j``, ``$2j+1``)."""
    body = "".join(f" {shift} and.b32 o, o, 0x7F80; or.b32 o, o, l; add.u32 o, o, b; "
                   + load.format(lo=2 * j, hi=2 * j + 1) for j, shift in enumerate(_SHIFTS))
    return tl.constexpr("{ .reg .u32 o, l, b, v; .reg .b16 h0, h1; mov.u32 l, %laneid; " + copy
                        + f" mov.u32 b, {table};" + body + " }")


_WORD_PAIRS = _word("qc_pairs", "and.b32 l, l, 15; shl.b32 l, l, 3;", "ld.shared.v2.f32 {{${lo}, ${hi}}}, [o];")
_WORD_HALF = _word("qc_pairs16", "shl.b32 l, l, 2;",
                   "ld.shared.b32 v, [o]; mov.b32 {{h0, h1}}, v; cvt.f32.f16 ${lo}, h0; cvt.f32.f16 ${hi}, h1;")


@triton.jit
def pair_table(cb_ptr, LOOKUP: tl.constexpr, INTERPRET: tl.constexpr):
    """Declare the ``LOOKUP`` table and fill it; the caller places a barrier before the first
    lookup. A no-op under the interpreter."""
    if not INTERPRET:
        if LOOKUP == 1:
            tl.inline_asm_elementwise(_FILL_PAIRS, "=r,l", [cb_ptr], dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise(_FILL_HALF, "=r,l", [cb_ptr], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _plain(w, cb_ptr, SHIFT: tl.constexpr, LOOKUP: tl.constexpr):
    v = tl.load(cb_ptr + ((w >> SHIFT) & 15))
    if LOOKUP == 2:
        v = v.to(tl.float16).to(tl.float32)
    return v


@triton.jit
def pair_values(w, cb_ptr, LOOKUP: tl.constexpr, INTERPRET: tl.constexpr):
    """The centroids of the eight nibbles of every word in ``w`` (uint32), plane k for
    coordinate 8i + k, as ``lookup.nibble_values`` returns them, from the ``LOOKUP`` table."""
    if INTERPRET:
        v0 = _plain(w, cb_ptr, 0, LOOKUP)
        v1 = _plain(w, cb_ptr, 4, LOOKUP)
        v2 = _plain(w, cb_ptr, 8, LOOKUP)
        v3 = _plain(w, cb_ptr, 12, LOOKUP)
        v4 = _plain(w, cb_ptr, 16, LOOKUP)
        v5 = _plain(w, cb_ptr, 20, LOOKUP)
        v6 = _plain(w, cb_ptr, 24, LOOKUP)
        v7 = _plain(w, cb_ptr, 28, LOOKUP)
    elif LOOKUP == 1:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _WORD_PAIRS, "=r,=r,=r,=r,=r,=r,=r,=r,r", [w], dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    else:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _WORD_HALF, "=r,=r,=r,=r,=r,=r,=r,=r,r", [w], dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    return v0, v1, v2, v3, v4, v5, v6, v7


#: fp16's largest finite value and smallest normal one.
_HALF_MAX = 65504.0
_HALF_MIN_NORMAL = 2.0**-14


def half_codebook(codebook: torch.Tensor) -> bool:
    """Whether every centroid of ``codebook`` is zero or a normal fp16 number in magnitude,
    so that rounding it to fp16 costs at most 2⁻¹¹ of its value (reads it: one copy to the
    host)."""
    mags = codebook.detach().abs().to("cpu", torch.float64)
    return bool(((mags == 0) | ((mags >= _HALF_MIN_NORMAL) & (mags <= _HALF_MAX))).all())
