"""``trtllm_moe_triton``: a grouped W8A16 GEMM in Triton that reads the weights in
TensorRT-LLM's preprocessed MoE layout (the bytes TensorRT-LLM's own kernels read), with
the group-wise dequantization fused into the GEMM. The kernel and its layout
arithmetic are in :mod:`.triton_source`; this module prepares weights, picks tiles and
launches.

On CUDA (SM >= 8.0) it compiles; on CPU it runs under Triton's interpreter
(``TRITON_INTERPRET=1``), where dots are done in float32 because the interpreter's
bf16 dot is wrong (notes/triton-interpreter.md), and the output is rounded by torch
because the interpreter's fp32 → bf16 conversion truncates (measured: 517 of 1024
random values off by one ulp, all equal to truncation).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from quantcore.cost import Cost
from quantcore.errors import KernelInputError
from quantcore.kernel import Requirements, Support
from quantcore.ops.moe import check_routing
from quantcore.probe import Capabilities
from quantcore.problem import Problem

from .base import TRTLLMMoEKernel
from .cost import moe_bytes, moe_flops
from .preprocess import CutlassMixedGemmLayout, QuantType
from .routing import align_routes
from .weights import ACT_DTYPES, load_expert_weights

__all__ = ["MoETile", "TritonMoE", "TritonMoEWeights", "check_tile", "pick_tile"]

#: The layout TensorRT-LLM's MoE uses on SM 80–90 (``force_interleave`` maps 90 to 80).
MOE_LAYOUT = CutlassMixedGemmLayout(QuantType.W8_A16, arch=80)
CHUNK = 64  # K rows per interleaved column tile of the layout
#: Up to this many routes run in one dense launch; more are sorted by expert.
DENSE_MAX_ROUTES = 32


@dataclass(frozen=True)
class TritonMoEWeights:
    layout: torch.Tensor  # int8 [E, K, N] bytes: TensorRT-LLM's preprocessed MoE layout
    scales: torch.Tensor  # [E, G, N]
    zeros: torch.Tensor | None
    k_order: torch.Tensor  # int64 [K]: logical row of each stored position
    group_size: int

    @property
    def num_experts(self) -> int:
        return self.layout.shape[0]

    @property
    def k(self) -> int:
        return self.layout.shape[1]

    @property
    def n(self) -> int:
        return self.layout.shape[2]


@dataclass(frozen=True)
class MoETile:
    """Launch shape and variant (see :mod:`.triton_source`): ``dense`` decode launch or
    sorted blocks; ``pre_scale`` dequantizes before the dot (prefill) or scales after it
    (decode); ``magic`` converts codes with bit operations instead of int-to-float."""

    bm: int
    bn: int
    bk: int
    num_warps: int = 4
    num_stages: int = 3
    dense: bool = False
    pre_scale: bool = False
    magic: bool = True


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def stored_row_order(k: int, device: torch.device) -> torch.Tensor:
    """Logical K row of every stored position of the layout, read off the preprocessor
    itself (a column whose codes are their own row numbers), so the kernel follows the
    layout exactly: σ(j) = 16·(j//16) + (j%16)//2 + 8·(j%2) within each 64-row chunk."""
    rows = torch.arange(CHUNK, dtype=torch.int16) - 128
    probe = MOE_LAYOUT.apply(rows.to(torch.int8).view(CHUNK, 1).expand(CHUNK, 32).contiguous())
    sigma = (probe.view(-1)[:CHUNK].to(torch.int16) & 0xFF).long()  # the biased byte is the row
    chunks = torch.arange(0, k, CHUNK).view(-1, 1)
    return (chunks + sigma.view(1, -1)).reshape(-1).to(device)


def pick_tile(routes: int, experts: int, n: int, group: int, sym: bool = True) -> MoETile:
    """Tiles by the routes an expert can expect, as measured on an H100
    (benchmarks/results/trtllm_moe-NVIDIA-H100-80GB-HBM3.md): a dense launch up to 32
    routes, then sorted blocks, pre-scaled once blocks are large.

    Asymmetric weights stay at ``bm <= 128``: with ``bm = 256`` (3 stages) the H100 gave
    a 10 % error on one asymmetric group-64 cell (K = 128, T = 512, E = 1) that the
    interpreter computes correctly; until that is understood, only configurations that
    passed there are chosen."""
    bk = min(128, group)
    if _interpreted():  # small tiles: the interpreter pays per element, not per program
        bm = 16 if routes <= 16 else 32 if routes <= 32 else 64
        return MoETile(bm, min(64, n), 64, dense=routes <= DENSE_MAX_ROUTES, pre_scale=bm == 64)
    if routes <= DENSE_MAX_ROUTES:
        return MoETile(max(16, triton_next_pow2(routes)), 64, bk, 4, 4, dense=True)
    per_expert = routes / experts
    if per_expert <= 24:
        return MoETile(16 if per_expert <= 12 else 32, 128, 64, 8, 4)
    if per_expert <= 96:
        return MoETile(64, 128, 64, 8, 4, pre_scale=True)
    if not sym:
        return MoETile(128, 128, 64, 8, 4, pre_scale=True)
    return MoETile(256, 128, 64, 8, 3 if per_expert <= 256 else 4, pre_scale=True)


def check_tile(tile: MoETile, routes: int, group: int) -> None:
    """A K-tile must lie in one group and be whole 64-row chunks of the layout (so column
    pairs are whole too); a dense launch must hold every route."""
    problems = []
    if tile.bk % CHUNK or group % tile.bk:
        problems.append(f"bk={tile.bk} must be a multiple of {CHUNK} dividing group_size={group}")
    if any(v < 16 or v & (v - 1) for v in (tile.bm, tile.bn, tile.bk)):
        problems.append("bm, bn, bk must be powers of two >= 16 (tl.arange, tl.dot)")
    if tile.dense and tile.bm < routes:
        problems.append(f"a dense launch takes all {routes} routes in one block, bm={tile.bm}")
    if problems:
        raise KernelInputError(f"tile {tile}: " + "; ".join(problems))


def triton_next_pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


class TritonMoE(TRTLLMMoEKernel):
    name: ClassVar[str] = "trtllm_moe_triton"
    prepared_type: ClassVar[type] = TritonMoEWeights
    priority: ClassVar[int] = 50
    description: ClassVar[str] = (
        "Triton grouped W8A16 GEMM on TensorRT-LLM's preprocessed MoE layout, dequantization fused"
    )
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda", "cpu"}), packages=("triton",)
    )

    @classmethod
    def check_device(cls, caps: Capabilities) -> str | None:
        reason = cls.requires.check(caps)
        if reason or caps.device_type != "cuda":
            return reason
        cc = caps.compute_capability
        if cc is None or cc < (8, 0):
            return f"needs compute capability >= 8.0 (bf16 tensor cores), device has {cc}"
        return None

    @classmethod
    def priority_on(cls, caps: Capabilities) -> int:
        # On a CPU it runs under the interpreter: a check, not a fast path.
        return cls.priority if caps.device_type == "cuda" else 1

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost:
        # benchmarks/results/nvidia-h100-80gb-hbm3/trtllm_moe.json (CUDA graphs): 72-81 % of
        # the copy bandwidth for T <= 64; compute-bound beyond, at ~32 % of the bf16 matmul
        # rate at T = 512 and ~57 % at T = 4096 (bigger tiles fill). On a CPU: the interpreter.
        if caps.device_type == "cpu":
            return Cost(moe_bytes(problem), moe_flops(problem), 2e-4, 2e-4, 3, "Triton interpreter")
        routes = problem["T"] * problem["topk"]
        return Cost(moe_bytes(problem), moe_flops(problem), 0.75, 0.55 if routes >= 8192 else 0.32, 3,
                    "fit to nvidia-h100 results")

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        base = super().supports(problem)
        if not base:
            return base
        k, n = problem.get("K"), problem.get("N")
        if k is not None and k % CHUNK:
            return Support.no(f"K={k}: the MoE layout interleaves columns in tiles of {CHUNK} rows")
        if n is not None and n % 32:
            return Support.no(f"N={n}: the MoE layout needs N % 32 == 0")
        return Support.yes()

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> TritonMoEWeights:
        w = load_expert_weights(self.fmt, tensors, self.device, dtype)  # type: ignore[arg-type]
        return TritonMoEWeights(
            layout=MOE_LAYOUT.apply(w.qweight),
            scales=w.scales,
            zeros=w.zeros,
            k_order=stored_row_order(w.k, self.device),
            group_size=w.group_size,
        )

    def __call__(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        prepared: TritonMoEWeights,
        *,
        topk_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self.require_prepared(prepared)
        check_routing(
            x, topk_ids, topk_weights, num_experts=prepared.num_experts, k=prepared.k,
            dtypes=ACT_DTYPES, device=prepared.layout.device,
        )
        return self.forward(x, topk_ids, prepared, topk_weights=topk_weights)

    def forward(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        prepared: TritonMoEWeights,
        *,
        topk_weights: torch.Tensor | None = None,
        tile: MoETile | None = None,
    ) -> torch.Tensor:
        """The call without validation and without any host synchronisation (CUDA-graph
        safe). Inputs must satisfy :func:`~quantcore.ops.moe.check_routing`."""
        from .triton_source import moe_w8a16_kernel

        t, topk = topk_ids.shape
        e, k, n = prepared.layout.shape
        routes = t * topk
        tile = tile or pick_tile(routes, e, n, prepared.group_size, prepared.zeros is None)
        check_tile(tile, routes, prepared.group_size)
        x_perm = x.reshape(-1, k).index_select(1, prepared.k_order)
        route_ids = topk_ids.reshape(-1).to(torch.int32)
        weighted = topk_weights is not None
        # fp32 out when the routes are summed afterwards, and under the interpreter, whose
        # fp32 → bf16 conversion truncates instead of rounding to nearest.
        y_dtype = torch.float32 if weighted or _interpreted() else x.dtype
        y = torch.empty(routes, n, dtype=y_dtype, device=x.device)
        if tile.dense:
            grid_r, sorted_routes, block_expert = e, route_ids, route_ids
        else:
            aligned = align_routes(route_ids, e, tile.bm)
            grid_r, sorted_routes, block_expert = aligned.num_blocks, aligned.sorted_routes, aligned.block_expert
        rw = topk_weights.reshape(-1).float().contiguous() if weighted else x_perm
        zeros = prepared.zeros if prepared.zeros is not None else prepared.scales
        grid = (grid_r, triton_cdiv(n, tile.bn))
        moe_w8a16_kernel[grid](
            x_perm, x_perm.stride(0),
            prepared.layout, prepared.scales, zeros,
            route_ids, sorted_routes, block_expert, rw,
            y, y.stride(0),
            routes, n, prepared.scales.shape[1], topk if x.dim() == 2 else 1,
            K=k, GROUP=prepared.group_size, BM=tile.bm, BN=tile.bn, BK=tile.bk,
            SYM=prepared.zeros is None, DENSE=tile.dense, HAS_RW=weighted,
            FP32_DOT=_interpreted(), PRE_SCALE=tile.pre_scale, MAGIC=tile.magic,
            num_warps=tile.num_warps, num_stages=tile.num_stages,
        )
        if weighted:
            return y.view(t, topk, n).sum(dim=1).to(x.dtype)
        return y.view(t, topk, n).to(x.dtype)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
