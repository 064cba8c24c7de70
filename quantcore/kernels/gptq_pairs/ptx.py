"""The inline PTX that turns one word of pair-interleaved codes (:mod:`.layout`) into a
tensor-core operand register: the one text both the ``triton_int4`` and the
``hopper_wgmma`` kernels inline. Plain strings: no triton import."""

from __future__ import annotations

__all__ = ["offset_pair_asm_text", "pair_asm_text"]


def pair_asm_text(bits: int, fp16: bool, shift: int, with_zero: bool, scaled: bool) -> str:
    """PTX for one 32-bit word of the int16 view (two inputs, k and k + 1, of one row):
    its field at bit ``shift`` of each half → the pair ``(q₀ − z, q₁ − z)`` packed in the
    activation dtype, exactly (times the scale, rounded once, when ``scaled``).

    ``0x4300 | q`` is bf16 ``128 + q`` and ``0x6400 | q`` fp16 ``1024 + q``: one LOP3
    makes the pair ``B + q``, one packed FMA subtracts ``B + z`` exactly, a second (when
    scaled) multiplies by the scale. Operands: ``$1`` the word; then, with zero points,
    the pair ``−(B + z)`` (one register; for 8-bit bf16 ``2^23 + z`` as fp32, two); then,
    when scaled, the scale (the pair, or for 8-bit bf16 fp32, two)."""
    src = f"shr.u32 t, $1, {shift};" if shift else "mov.b32 t, $1;"
    wide = bits == 8 and not fp16
    reg = 2
    zero = "zf" if wide else "nz"
    if with_zero:
        zero, reg = f"${reg}", reg + (2 if wide else 1)
    scale = f"${reg}" if scaled else ""
    if not wide:
        mask = "0x000F000F" if bits == 4 else "0x00FF00FF"
        magic, one = ("0x64006400", "0x3C003C00") if fp16 else ("0x43004300", "0x3F803F80")
        sym = {(4, True): "0xE408E408", (8, True): "0xE480E480", (4, False): "0xC308C308"}[(bits, fp16)]
        x2 = "f16x2" if fp16 else "bf16x2"
        # t·1 + (−(B + z)) is exact; the scale multiplies by an FMA with −0 (sm_80 and
        # sm_90 have no bf16x2 mul), which rounds once, as a multiply would.
        tail = (f" fma.rn.{x2} $0, t, one, {zero}; }}" if not scaled else
                f" fma.rn.{x2} t, t, one, {zero}; fma.rn.{x2} $0, t, {scale}, mz; }}")
        return ("{ .reg .b32 t, one, nz, mz; mov.b32 one, " + one + "; mov.b32 nz, " + sym
                + "; mov.b32 mz, 0x80008000; " + src + f" lop3.b32 t, t, {mask}, {magic}, 0xea;" + tail)
    # 8-bit codes overflow bf16's mantissa as B + q: each code through fp32 (2^23 + q, one
    # PRMT places byte i under the exponent bits of 2^23), then exact subtraction.
    i = shift // 8
    mul = f" mul.f32 lo, lo, {scale}; mul.f32 hi, hi, {scale};" if scaled else ""
    return ("{ .reg .b32 lo, hi, zf, mg; mov.b32 mg, 0x4B000000; mov.b32 zf, 0x4B000080;"
            f" prmt.b32 lo, $1, mg, 0x744{i}; prmt.b32 hi, $1, mg, 0x744{i + 2};"
            f" sub.f32 lo, lo, {zero}; sub.f32 hi, hi, {zero};{mul} cvt.rn.bf16x2.f32 $0, hi, lo; }}")


def offset_pair_asm_text(fp16: bool, shift: int) -> str:
    """PTX for one 32-bit word of 4-bit codes: its field at bit ``shift`` of each half →
    the pair ``(B + q₀, B + q₁)``, ``B`` = 128 (bf16) or 1024 (fp16), exactly: one shift and
    one LOP3, no subtraction. A kernel that multiplies this operand owes the product
    ``−(B + z)·Σx`` and the scale afterwards, per group, in fp32."""
    src = f"shr.u32 t, $1, {shift};" if shift else "mov.b32 t, $1;"
    magic = "0x64006400" if fp16 else "0x43004300"
    return "{ .reg .b32 t; " + src + f" lop3.b32 $0, t, 0x000F000F, {magic}, 0xea; }}"
