"""The input rotation of every pass (``rotation.py``'s one GEMM) as a Triton launch bound to
its launcher (:class:`quantcore.triton.launch.Launch`): the same ``x_rot [M, G, P, d]`` for
a few microseconds of host time, where a cuBLAS call through torch takes 15-18 (an H100's
and an H200's host: ``F.linear``'s host time in ``benchmarks/results/<card>/overhead.json``).
An eager call of a kernel that rotates x before its launch pays it at every call.

Each program multiplies ``BM`` rows of one group of x, ``[BM, d]``, by that group's side by
side rotations ``[d, P·d]`` (``InputRotation.rhs``; the shared one for every group), in
float32, and stores them rounded once to x's dtype: each value is the dot product of d
terms that the GEMM computes, accumulated in float32 in the tensor cores' order. Imports
triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...triton.launch import Launch
from .rotation import InputRotation

__all__ = ["RotationLaunch", "rotate_rows_kernel"]

#: Rows of x a program rotates: 16 (the least a ``tl.dot`` takes) up to this many rows, 64 above.
SMALL_ROWS = 16


@triton.jit
def rotate_rows_kernel(x_ptr, rhs_ptr, out_ptr, M,
                       D: tl.constexpr, COLS: tl.constexpr, GROUPS: tl.constexpr, SHARED: tl.constexpr,
                       BM: tl.constexpr):
    """``out[m, g, :] = x[m, g·D : (g+1)·D] @ rhs[g or 0]`` for ``BM`` rows ``m`` of group ``g``
    (program ``(m-block, g)``); ``rhs`` is ``[R, D, COLS]``, x ``[M, GROUPS·D]`` and out
    ``[M, GROUPS·COLS]`` contiguous."""
    pid_m = tl.program_id(0)
    g = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)
    ks = tl.arange(0, D)
    cols = tl.arange(0, COLS)
    live = rows[:, None] < M
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * (GROUPS * D) + g * D + ks[None, :], mask=live, other=0.0)
    r = 0 if SHARED else g
    w = tl.load(rhs_ptr + r * (D * COLS) + ks[:, None] * COLS + cols[None, :])
    acc = tl.dot(x, w)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * (GROUPS * COLS) + g * COLS + cols[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=live)


#: ``rotate_rows_kernel``'s arguments that change between calls: x, the output and M.
VARYING = (0, 2, 3)
#: The rotations: the same tensor at every call of a layer.
FIXED = (1,)


class RotationLaunch:
    """``x2d [M, K] ↦ x_rot [M·G, P·d]`` as :class:`InputRotation` gives it, by one bound
    launch per row tile size: x contiguous in the rotations' dtype, 16-bit on a GPU (a
    float32 ``tl.dot`` there would take TF32); d and P·d powers of two."""

    def __init__(self, rotation: InputRotation, k: int, device: torch.device) -> None:
        self.rotation = rotation
        d, cols = rotation.d, rotation.copies * rotation.d
        self.groups, self.cols = k // d, cols
        self.rhs = rotation.rhs.contiguous()
        shared = rotation.shared
        self.launches = {bm: Launch(rotate_rows_kernel, device=device, varying=VARYING, fixed_pointers=FIXED,
                                    constexprs=dict(D=d, COLS=cols, GROUPS=self.groups, SHARED=shared, BM=bm),
                                    options=dict(num_warps=4 if bm == SMALL_ROWS else 8))
                         for bm in (SMALL_ROWS, 64)}

    def __call__(self, x2d: torch.Tensor) -> torch.Tensor:
        return self.rows(x2d).view(x2d.shape[0] * self.groups, self.cols)

    def rows(self, x2d: torch.Tensor) -> torch.Tensor:
        """The same values as ``[M, G·P·d]``: each row of x rotated, its groups' copies side
        by side (the code matrix's inputs, as a kernel over every pass reads them)."""
        m = x2d.shape[0]
        out = torch.empty(m, self.groups * self.cols, dtype=x2d.dtype, device=x2d.device)
        bm = SMALL_ROWS if m <= SMALL_ROWS else 64
        self.launches[bm]((-(-m // bm), self.groups, 1), x2d, self.rhs, out, m)
        return out
