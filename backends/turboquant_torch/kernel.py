"""The TurboQuant forward pass (docs/formats/turboquant.md), step by step, one group of d input columns at a time.

Rotate x per group (one batched GEMM for all groups), then per group: look the
indices of that slice up in a 256-entry table of byte → (low, high) centroid pairs
(unpack and lookup in one gather), multiply, rescale by the (row, group) scale and add.
Only one ``[N, d]`` slice of the dequantized weight exists at any time (a slice
per group, reused) — never the whole ``[N, K]`` weight.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from quantcore.cost import Cost
from quantcore.kernel import Requirements
from quantcore.kernels.turboquant.base import (
    PassData,
    TurboQuantLinearKernel,
    TurboQuantPrepared,
    rotate_input,
)
from quantcore.kernels.turboquant.cost import passes, rotation_flops, weight_bytes
from quantcore.probe import Capabilities
from quantcore.problem import Problem

__all__ = ["TurboQuantTorch", "byte_pair_table"]


def byte_pair_table(codebook: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[256, 2]``: row b holds ``(c[b & 15], c[b >> 4])``, the two centroids byte b encodes."""
    b = torch.arange(256, device=codebook.device)
    levels = codebook.shape[0]
    lo, hi = (b & 0xF).clamp_max(levels - 1), (b >> 4).clamp_max(levels - 1)
    return torch.stack((codebook[lo], codebook[hi]), dim=-1).to(dtype)


class TurboQuantTorch(TurboQuantLinearKernel):
    name: ClassVar[str] = "turboquant_torch"
    priority: ClassVar[int] = 50
    description: ClassVar[str] = "TurboQuant per-group rotate → lookup → matmul → rescale in plain PyTorch"
    requires: ClassVar[Requirements] = Requirements(device_types=frozenset({"cpu", "cuda", "xpu", "npu"}))

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # Per group of d inputs and per pass: gather the [N, d] slice (int32 codes, then the
        # slice in the compute dtype, each written and read), a small matmul, and a
        # read-modify-write of the [M, N] float32 accumulator; ~5 ops a group. Fit to
        # benchmarks/results (H100: 0.5-2 ms a call; the AMD EPYC: see turboquant_linear).
        m, k, n = problem["M"], problem["K"], problem["N"]
        d = getattr(problem.format, "group_size", 128)
        n_pass, groups = passes(problem), max(1, k // d)
        moved = weight_bytes(problem) + n_pass * (8 * k * n + groups * 12 * m * n) + 2 * (m * k + m * n)
        flops = n_pass * 2 * m * k * n + rotation_flops(problem)
        return Cost(moved, flops, bandwidth=0.3, compute=0.3, launches=5 * groups * n_pass,
                    note="fit to benchmarks/results")

    def run_pass(
        self,
        x2d: torch.Tensor,
        data: PassData,
        prepared: TurboQuantPrepared,
        *,
        partial: torch.Tensor | None,
        bias: torch.Tensor | None,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        x_rot = rotate_input(x2d, data.rotation)  # [M, K] in the compute dtype
        key = ("byte_pairs", x_rot.dtype)
        table = prepared.cache.get(key)
        if table is None:
            table = prepared.cache[key] = byte_pair_table(prepared.codebook, x_rot.dtype)
        n = data.indices.shape[0]
        d = prepared.group_size
        half = d // 2
        out = partial.clone() if partial is not None else x_rot.new_zeros(x_rot.shape[0], n, dtype=torch.float32)
        for g in range(prepared.in_features // d):
            codes = data.indices[:, g * half:(g + 1) * half].reshape(-1).to(torch.int32)
            w_g = table.index_select(0, codes).view(n, d)  # the one dequantized slice
            y_g = x_rot[:, g * d:(g + 1) * d] @ w_g.T
            out.addcmul_(y_g, data.scales[:, g])
        if bias is not None:
            out += bias
        return out.to(out_dtype)
