"""A codebook's centroids as ``hopper_wgmma``'s weight operand (``kernels.py``, ``LOOKUP``):
the PTX that fills a 16-entry float32 table in shared memory and the PTX that turns one
32-bit word of 4-bit codes into the operand pair ``(c[q₀]·s, c[q₁]·s)``.

The table is a function-scope ``.shared`` array that the PTX declares (a Gluon shared
buffer has no address to hand to inline PTX): 16 words in 16 banks, so a warp's 32
lookups never conflict. It is declared 1 KB long and 1 KB aligned although it uses 64
bytes: static shared memory comes first in the block's window, and the kernel's TMA
buffers after it must stay 1024-byte aligned (wgmma reads swizzled tiles by address bits).

In the wgmma kernel a pair is two lookups, two float32 multiplies by the row's group scale
and one conversion that rounds each product once to the activation dtype: ``ŵ = rn(c·s)``,
the operand contract of TurboQuant's scaled operand (``backends/turboquant_triton/configs.py``,
``MmaConfig.scaled_operand``). The decode kernel, which scales each group's float32
product when the group closes, takes ``rn(c)`` (no multiply), the contract of TurboQuant's
register operand.
"""

from __future__ import annotations

__all__ = ["CODEBOOK_FILL_ASM", "CODEBOOK_SYMBOL", "lookup_pair_asm_text"]

#: The table's name in the PTX.
CODEBOOK_SYMBOL = "qc_wgmma_codebook"

#: Threads 0-15 each load one centroid (``$1``: that thread's pointer into the codebook)
#: and store it at ``table + 4·tid``; ``$0`` is a dummy result. The caller emits this once
#: per thread (a layout of one element a thread) and places a CTA barrier after it.
CODEBOOK_FILL_ASM = (
    f".shared .align 1024 .b8 {CODEBOOK_SYMBOL}[1024];"
    " { .reg .pred p; .reg .u32 t, s; .reg .b32 v;"
    " mov.u32 t, %tid.x; setp.lt.u32 p, t, 16;"
    " @p ld.global.nc.b32 v, [$1];"
    f" mov.u32 s, {CODEBOOK_SYMBOL}; mad.lo.u32 s, t, 4, s;"
    " @p st.shared.b32 [s], v;"
    " mov.u32 $0, 0; }"
)


def lookup_pair_asm_text(fp16: bool, shift: int, scaled: bool = True) -> str:
    """PTX for one 32-bit word of the int16 view (inputs k and k + 1 of one row, as
    ``kernels.py`` reads them): its 4-bit field at bit ``shift`` of each half, looked up,
    when ``scaled`` times the scale (``$2``, ``$3``: the two halves' float32 scale, the same
    row's), packed in the activation dtype with each value rounded once. Unscaled, the
    kernel owes the scale to the group's float32 product (the decode kernel, ``decode.py``)."""
    lo = "shl.b32 a, $1, 2;" if shift == 0 else f"shr.u32 a, $1, {shift - 2};"
    cvt = "cvt.rn.f16x2.f32" if fp16 else "cvt.rn.bf16x2.f32"
    mul = " mul.rn.f32 lo, lo, $2; mul.rn.f32 hi, hi, $3;" if scaled else ""
    return ("{ .reg .b32 a, b, t; .reg .f32 lo, hi; "
            f"{lo} and.b32 a, a, 0x3C; shr.u32 b, $1, {shift + 14}; and.b32 b, b, 0x3C;"
            f" mov.u32 t, {CODEBOOK_SYMBOL}; add.u32 a, a, t; add.u32 b, b, t;"
            f" ld.shared.f32 lo, [a]; ld.shared.f32 hi, [b];{mul}"
            f" {cvt} $0, hi, lo; }}")
