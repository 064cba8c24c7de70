"""The gated activation's Triton kernel: ``out[r, c] = act(h[r, c]) · h[r, I + c]`` (``I`` is ``INTER``).

Program ``(r, b)`` takes row ``r`` and the columns ``[b·BLOCK, (b+1)·BLOCK)`` of both
halves: one read of each element of ``h``, one write of each element of ``out``, nothing
else (no reduction, no workspace). Rows are ``h_row_stride`` elements apart (a fused
layer's output, or rows of a larger buffer); ``out`` is a new ``[M, I]``.

The arithmetic is the contract of :mod:`.op`, step for step as torch's CUDA kernels do it:
``g`` to float32, the activation in float32 by torch's formula and operation order,
rounded to the dtype, then the float32 product of the two dtype values, rounded to the
dtype. The division is the IEEE one (``div_rn``: Triton's ``/`` on float32 is an
approximate division on a GPU), and kernels are launched with ``enable_fp_fusion=False``
so no product is fused into a sum.

``COMPILED`` (set by the launcher: a GPU, not the interpreter) picks what differs between
the two. Compiled, ``exp`` and ``erf`` are libdevice's (the CUDA math library's ``expf`` and
``erff`` as Triton bundles it; Triton's own ``exp`` is the approximate ``ex2`` path) and
rounding to the dtype is the hardware's round-to-nearest-even conversion. torch's kernels
compile their own build of those functions, which need not give the same last bits: where
``1 + erf`` cancels, gelu turns a last-bit difference into many units of the result, which is
why :mod:`.op` sends gelu to torch's ops on CUDA.
Interpreted, they are the interpreter's (it has no libdevice), and bf16 is rounded by
bit operations (:func:`_rounded`: round to nearest even on the 32-bit pattern), since the
interpreter's float32 → bf16 cast truncates (docs/triton-interpreter.md); both roundings
give the same bits. bf16 is widened to float32 by its 16 high bits on both.

Imported only when the kernel runs (it imports triton).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from ...triton.interpreter import serialize_launches

__all__ = ["gated_activation_kernel"]

serialize_launches()


@triton.jit
def _activation(g, ACT: tl.constexpr, COMPILED: tl.constexpr):
    """``act(g)`` for float32 ``g``, by torch's formula and order of operations."""
    if ACT == "silu":
        e = libdevice.exp(-g) if COMPILED else tl.exp(-g)
        a = tl.math.div_rn(g, 1.0 + e)
    elif ACT == "gelu":
        e = libdevice.erf(g * 0.7071067811865476) if COMPILED else tl.math.erf(g * 0.7071067811865476)
        a = g * 0.5 * (1.0 + e)
    else:  # relu: a NaN stays NaN, as torch's does
        a = tl.where(g < 0.0, 0.0, g)
    return a


@triton.jit
def _widened(x):
    """``x`` as float32, exactly."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _rounded(y, dtype: tl.constexpr, COMPILED: tl.constexpr):
    """Float32 ``y`` rounded to nearest (ties to even) in ``dtype``; a NaN stays a NaN."""
    if dtype == tl.bfloat16 and not COMPILED:
        bits = y.to(tl.uint32, bitcast=True)
        high = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # carries into the exponent: overflow is inf
        high = tl.where(y != y, (bits >> 16) | 0x40, high)  # a NaN quieted, its sign kept
        return high.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return y.to(dtype)


@triton.jit
def gated_activation_kernel(h_ptr, out_ptr, h_row_stride,
                            INTER: tl.constexpr, ACT: tl.constexpr, BLOCK: tl.constexpr, COMPILED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < INTER
    gate_ptr = h_ptr + row * h_row_stride + cols
    g = tl.load(gate_ptr, mask=inside, other=0.0)
    u = tl.load(gate_ptr + INTER, mask=inside, other=0.0)
    a = _rounded(_activation(_widened(g), ACT, COMPILED), g.dtype, COMPILED)
    y = _widened(a) * _widened(u)
    tl.store(out_ptr + row * INTER + cols, _rounded(y, g.dtype, COMPILED), mask=inside)
