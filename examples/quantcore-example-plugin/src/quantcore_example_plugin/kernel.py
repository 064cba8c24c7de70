"""GPTQ by zero folding: ``x · ((q − z) s)ᵀ = (x qᵀ − rowsum(x) zᵀ) · s`` per group.

A different algorithm from dequantize-then-matmul (codes stay integers until the
per-group rescale), which is what makes it worth running through the shared matrix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from quantcore import (
    Capabilities,
    KernelInputError,
    LinearKernel,
    Problem,
    Requirements,
    Support,
    UnsupportedProblemError,
)
from quantcore.cost import Cost
from quantcore.formats.gptq import GPTQ
from quantcore.tensors import check_activation, stored_on

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class Grouped:
    codes: torch.Tensor  # [G, gs, N] float32, inputs sorted by group
    zeros: torch.Tensor  # [G, N] float32
    scales: torch.Tensor  # [G, N] float32
    ret_idx: torch.Tensor  # [K] int64
    bias: torch.Tensor | None


class ZeroFoldingGPTQ(LinearKernel):
    name: ClassVar[str] = "zero_folding"
    format: ClassVar[str] = "gptq"
    priority: ClassVar[int] = 10
    description: ClassVar[str] = "example third-party plugin: per-group integer matmul with folded zeros"
    requires: ClassVar[Requirements] = Requirements(device_types=frozenset({"cpu"}))
    # The codes are kept as float32 (4 bytes a weight, twice a bf16 copy): for memory this
    # is a dense kernel, chosen by default only where nothing compressed can run.
    keeps_dense_weight: ClassVar[bool] = True

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # What it moves: the float32 codes, and the [M, groups, N] float32 partial sums it
        # writes and reads back; its einsum runs at about 7 % of the bf16 matmul rate and
        # streams at about 15 % of the copy bandwidth (benchmarks/results/amd-epyc/gptq_linear.json).
        m, k, n = problem["M"], problem["K"], problem["N"]
        fmt = problem.format
        groups = k // fmt.group_size if isinstance(fmt, GPTQ) and fmt.group_size > 0 else 1
        moved = 4 * k * n + 2 * 4 * m * groups * n + 4 * (m * k + m * n)
        return Cost(moved, 2 * m * k * n, bandwidth=0.15, compute=0.07, note="fit to benchmarks/results/amd-epyc")

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        fmt, k = problem.format, problem.get("K")
        if not isinstance(fmt, GPTQ):
            return Support.no("GPTQ only")
        if fmt.group_size != -1 and k is not None and k % fmt.group_size:
            return Support.no(f"K={k} is not a multiple of group_size={fmt.group_size}")
        return Support.yes()

    def prepare(self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None) -> Grouped:
        fmt = self.fmt
        assert isinstance(fmt, GPTQ)
        tensors = stored_on(tensors, self.device, where=f"{self.name} prepare")
        dims = fmt.validate(tensors)
        k, n = dims["K"], dims["N"]
        g_idx = fmt.group_index(tensors)
        ret_idx = torch.argsort(g_idx, stable=True)
        groups = fmt.num_groups(k)
        # The folded matmul takes groups of equal size: act-order groups of other sizes
        # (a valid checkpoint) are refused, and bind() moves on to the next kernel.
        even = torch.arange(k, device=g_idx.device) // (k // groups)
        if not torch.equal(g_idx[ret_idx], even):
            raise UnsupportedProblemError(f"g_idx: zero folding needs {groups} groups of {k // groups} inputs each")
        codes = fmt.unpack_weight(tensors)[ret_idx].float().reshape(groups, k // groups, n)
        bias = tensors.get("bias")
        return Grouped(
            codes=codes,
            zeros=fmt.unpack_zeros(tensors).float(),
            scales=tensors["scales"].float(),
            ret_idx=ret_idx,
            bias=bias.float() if bias is not None else None,
        )

    def __call__(self, x: torch.Tensor, prepared: Grouped) -> torch.Tensor:
        if type(prepared) is not Grouped:
            raise KernelInputError(f"prepared: expected the Grouped that {self.name}.prepare returns, got {type(prepared).__name__}")
        groups, size, n = prepared.codes.shape
        check_activation(x, k=groups * size, dtypes=ACT_DTYPES, device=prepared.codes.device)
        xs = x.reshape(-1, groups * size).float()[:, prepared.ret_idx].reshape(-1, groups, size)
        integer_part = torch.einsum("mgk,gkn->mgn", xs, prepared.codes)
        folded = integer_part - xs.sum(-1, keepdim=True) * prepared.zeros
        y = (folded * prepared.scales).sum(1)
        if prepared.bias is not None:
            y = y + prepared.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], n)
