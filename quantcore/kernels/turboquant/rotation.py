"""The input rotation of every pass of a layer in one GEMM, its right-hand side built once.

A TurboQuant pass moves its rotation Π_g from the weight to the activation: group g of x
times ``P = Πᵀ`` (:func:`.base.rotate_input`, one GEMM per pass). With two passes the
groups of x are the same and only the rotation differs, so one GEMM against the two
rotations side by side, ``[P₁ | P₂]`` ([d, 2d]), gives both: row (m, g) of the result is
``[x_g P₁ | x_g P₂]``, which in memory is ``x_rot [M, G, P, d]`` — pass p of group g at
``(g·P + p)·d`` within row m. The fused kernels read that layout directly (the tensor-core
kernel with its ``X_COPIES`` constexpr where it does not rotate x itself, the dequantize +
GEMM path as ``x_cat``).

Each dot product is the one :func:`.base.rotate_input` computes (the same operands, d
terms accumulated in float32); only the GEMM that holds it is wider.

``[P₁ | P₂]`` is a copy: a state dict loaded into the same rotation tensors (in place)
would leave it behind, so :meth:`InputRotation.current` compares their version counters
(inference tensors have none: a layer whose rotations are changed in place under
``torch.inference_mode`` must be prepared again).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ...tensors import version_of

__all__ = ["InputRotation"]


class InputRotation:
    """``x2d [M, K] ↦ x_rot [M·G, P·d]`` (contiguous; [M, G, P, d] in memory) for the P
    rotations given (each ``[R, d, d]``, R = 1 shared by every group or R = G), in their
    dtype. Made once per layer: a call is one GEMM (and a copy with R = G); ``x2d`` must
    be contiguous. ``columns`` (int64 [d], a permutation) puts rotated coordinate
    ``columns[j]`` at position j of each group: the rotations' columns are permuted in the
    copy, so each value is the same dot product."""

    def __init__(self, rotations: Sequence[torch.Tensor], columns: torch.Tensor | None = None) -> None:
        if not 1 <= len(rotations) <= 2:
            raise ValueError(f"InputRotation takes one or two rotations, got {len(rotations)}")
        first = rotations[0]
        r, d, _ = first.shape
        if columns is not None and sorted(columns.tolist()) != list(range(d)):
            raise ValueError(f"InputRotation columns: expected a permutation of range({d}), got {columns.tolist()}")
        self.d, self.copies, self.dtype = d, len(rotations), first.dtype
        self.shared = r == 1
        sides = [p if columns is None else p[:, :, columns.to(p.device)] for p in rotations]
        if self.shared:
            self.rhs = sides[0][0] if len(sides) == 1 else torch.cat([p[0] for p in sides], dim=1)
        else:
            self.rhs = sides[0] if len(sides) == 1 else torch.cat(sides, dim=2)
        #: The rotations ``rhs`` copied, and their versions then (one rotation as it is: ``rhs`` is it).
        self._copied = tuple(rotations) if len(rotations) > 1 or columns is not None else ()
        self._versions = [version_of(r) for r in self._copied]

    def current(self) -> bool:
        """Whether ``rhs`` still holds the rotations (none changed in place since)."""
        return not self._copied or [version_of(r) for r in self._copied] == self._versions

    def __call__(self, x2d: torch.Tensor) -> torch.Tensor:
        m, k = x2d.shape
        d = self.d
        x = x2d if x2d.dtype == self.dtype else x2d.to(self.dtype)
        if self.shared:
            return torch.mm(x.view(m * (k // d), d), self.rhs)
        rotated = torch.bmm(x.view(m, k // d, d).transpose(0, 1), self.rhs)  # [G, M, P·d]
        return rotated.transpose(0, 1).reshape(m * (k // d), self.copies * d)
