"""``trtllm_moe_triton``: a grouped W8A16 GEMM in Triton that reads the weights in
TensorRT-LLM's preprocessed MoE layout (the bytes TensorRT-LLM's own kernels read), with
the group-wise dequantization fused into the GEMM and, for the FFN, the SwiGLU fused
into its epilogue. The kernel is in :mod:`.triton_source`, the tiles in :mod:`.tiles`;
this module prepares weights and picks tiles, :mod:`.triton_launch` launches.

On CUDA (SM >= 8.0) it compiles; on CPU it runs under Triton's interpreter
(``TRITON_INTERPRET=1``), where dots are done in float32 because the interpreter's
bf16 dot is wrong (docs/triton-interpreter.md), and the output is rounded by torch
because the interpreter's fp32 → bf16 conversion truncates (measured: 517 of 1024
random values off by one ulp, all equal to truncation).

A call launches one kernel: for up to ``SMALL_MAX_ROUTES`` routes each program finds its
expert's routes (decode), above each program of a tile scheduler derives its tile from
the ids; above ``ONE_LAUNCH_MAX_ROUTES`` a one-program scheduling kernel sorts the routes
before the GEMM (two launches). None waits for the GPU, so a call can be captured in a
CUDA graph. The expert ids are not read on the host on CUDA
(:func:`reads_ids`): the kernels give a route whose id lies outside ``[0, E)`` a NaN row
and never use such an id as an address.
"""

from __future__ import annotations

import bisect
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from quantcore.cost import Cost
from quantcore.errors import KernelInputError
from quantcore.kernel import Requirements, Support
from quantcore.kernels.trtllm_moe import ACT_DTYPES, TRTLLMMoEKernel
from quantcore.kernels.trtllm_moe.cost import moe_bytes, moe_flops
from quantcore.ops.moe import check_routing
from quantcore.probe import Capabilities
from quantcore.probe.card import CardKey
from quantcore.probe.card_tables import card_of
from quantcore.problem import Problem
from quantcore.schema import Fields
from quantcore.triton import TESTED_TRITON

from .prepared_shard import shard_prepared_moe
from .preprocess import CutlassMixedGemmLayout, QuantType
from .tiles import (
    CHUNK,
    ONE_LAUNCH_MAX_ROUTES,
    SMALL_MAX_ROUTES,
    MoETile,
    pick_tile,
    pow2_at_least,
    tile_table,
    uses_wgmma,
)
from .weights import expert_schema, load_expert_weights

__all__ = ["MoETile", "TritonMoE", "TritonMoEWeights", "reads_ids", "stored_row_order"]

#: The layout TensorRT-LLM's MoE uses on SM 80–90 (``force_interleave`` maps 90 to 80).
MOE_LAYOUT = CutlassMixedGemmLayout(QuantType.W8_A16, arch=80)


@dataclass(frozen=True)
class TritonMoEWeights:
    layout: torch.Tensor  # int8 [E, K, N] bytes: TensorRT-LLM's preprocessed MoE layout
    scales: torch.Tensor  # [E, G, N]
    zeros: torch.Tensor | None
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


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def stored_row_order(k: int, device: torch.device) -> torch.Tensor:
    """Logical K row of every stored position of the layout, read off the preprocessor
    itself (a column whose codes are their own row numbers): σ(j) = 16·(j//16) +
    (j%16)//2 + 8·(j%2) within each 64-row chunk. The kernel's word reading relies on it
    (tests check it against the closed form)."""
    rows = torch.arange(CHUNK, dtype=torch.int16) - 128
    probe = MOE_LAYOUT.apply(rows.to(torch.int8).view(CHUNK, 1).expand(CHUNK, 32).contiguous())
    sigma = (probe.view(-1)[:CHUNK].to(torch.int16) & 0xFF).long()  # the biased byte is the row
    chunks = torch.arange(0, k, CHUNK).view(-1, 1)
    return (chunks + sigma.view(1, -1)).reshape(-1).to(device)


def reads_ids(topk_ids: object) -> bool:
    """Whether a call checks its expert ids' range on the host (``check_routing``'s
    ``check_ids``). Not on CUDA, where reading them waits for the GPU's queue: the kernels
    give a route with an id outside ``[0, E)`` a NaN row instead (triton_source.py). On a
    CPU reading them costs no synchronisation, and the caller gets the clear error."""
    return not (isinstance(topk_ids, torch.Tensor) and topk_ids.is_cuda)


def _facts(device: torch.device) -> tuple[CardKey | None, int]:
    """The card the tables are keyed by (None off CUDA and under the interpreter) and the
    SMs a persistent grid fills."""
    card = card_of(device)
    return card, card.sms if card is not None else 4


class TritonMoE(TRTLLMMoEKernel):
    name: ClassVar[str] = "trtllm_moe_triton"
    prepared_type: ClassVar[type] = TritonMoEWeights
    priority: ClassVar[int] = 50
    description: ClassVar[str] = (
        "Triton grouped W8A16 GEMM on TensorRT-LLM's preprocessed MoE layout, dequantization fused"
    )
    #: bf16 tensor cores on CUDA; the CPU runs it under Triton's interpreter.
    requires: ClassVar[Requirements] = Requirements(
        device_types=frozenset({"cuda", "cpu"}), min_capability=(8, 0), packages=("triton",),
        min_versions=(TESTED_TRITON,)
    )

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

    def prepared_schema(self, dims: Mapping[str, int]) -> Fields:
        return expert_schema(TritonMoEWeights, self.fmt, dims, "layout")  # type: ignore[arg-type]

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> TritonMoEWeights:
        w = load_expert_weights(self.fmt, tensors, self.device, dtype)  # type: ignore[arg-type]
        return TritonMoEWeights(
            layout=MOE_LAYOUT.apply(w.qweight), scales=w.scales, zeros=w.zeros, group_size=w.group_size,
        )

    def _checked(self, x: torch.Tensor, topk_ids: torch.Tensor, prepared: TritonMoEWeights,
                 topk_weights: torch.Tensor | None) -> None:
        self.require_prepared(prepared)
        layout = prepared.layout
        e, k, _ = layout.shape
        check_routing(
            x, topk_ids, topk_weights, num_experts=e, k=k, dtypes=ACT_DTYPES, device=layout.device,
            check_ids=reads_ids(topk_ids),
        )

    def shard_prepared(self, prepared: TritonMoEWeights, *, dim: str, rank: int, world: int) -> TritonMoEWeights:
        """Rank ``rank``'s part of prepared weights, the preprocessed layout cut in place
        (:mod:`.prepared_shard`); equal to ``prepare`` of the format's shard."""
        self.require_prepared(prepared)
        return shard_prepared_moe(prepared, MOE_LAYOUT, dim=dim, rank=rank, world=world)

    def __call__(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        prepared: TritonMoEWeights,
        *,
        topk_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self._checked(x, topk_ids, prepared, topk_weights)
        return self._run(x, topk_ids, prepared, topk_weights, None, False)

    def gated(self, x: torch.Tensor, topk_ids: torch.Tensor, prepared: TritonMoEWeights) -> torch.Tensor:
        """The FFN's first GEMM with TensorRT-LLM's SwiGLU fused into the epilogue:
        ``[T, topk, N/2]`` in the activation dtype (see :meth:`MoEKernel.gated`)."""
        self._checked(x, topk_ids, prepared, None)
        if prepared.n % 64:
            raise KernelInputError(f"gated: N={prepared.n} must be a multiple of 64 (32 SwiGLU columns per tile)")
        return self._run(x, topk_ids, prepared, None, None, True)

    def forward(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        prepared: TritonMoEWeights,
        *,
        topk_weights: torch.Tensor | None = None,
        tile: MoETile | None = None,
        gated: bool = False,
    ) -> torch.Tensor:
        """The call without validation and without any host synchronisation (CUDA-graph
        safe). Inputs must satisfy :func:`~quantcore.ops.moe.check_routing` but for the ids'
        range: a route whose expert id lies outside ``[0, E)`` gets NaN in its output row
        (with ``topk_weights``, its token's row)."""
        return self._run(x, topk_ids, prepared, topk_weights, tile, gated)

    def _run(self, x: torch.Tensor, topk_ids: torch.Tensor, prepared: TritonMoEWeights,
             topk_weights: torch.Tensor | None, tile: MoETile | None, gated: bool) -> torch.Tensor:
        """:meth:`forward`, its options as positions."""
        t, topk = topk_ids.shape
        routes = t * topk
        weighted = topk_weights is not None
        if routes == 0:
            n = prepared.n // 2 if gated else prepared.n
            return torch.zeros((t, n) if weighted else (t, topk, n), dtype=x.dtype, device=x.device)
        layout = prepared.layout
        # Kept with the layout tensor (the custom op rebuilds the state object at every call).
        # The tensor fixes the device (x is on it: check_routing), so the keys leave it out.
        state = _launcher().launch_state(layout)
        if tile is None:
            points = state.get(_ROUTE_POINTS)
            if points is None:
                points = state[_ROUTE_POINTS] = _route_points(prepared, x.device)
            key: tuple[object, ...] = (bisect.bisect_left(points[0], routes), gated, weighted, x.dtype)
        else:
            key = (tile, pow2_at_least(routes, 16), gated, weighted, x.dtype)
        bucket = state.get(key)
        if bucket is None or bucket.scales is not prepared.scales or bucket.zeros is not prepared.zeros:
            if tile is None:
                tile = pick_tile(routes, prepared.num_experts, prepared.k, prepared.group_size,
                                 scale_dtype=prepared.scales.dtype, card=points[1], interpreted=interpreted())
            bucket = state[key] = self._bucket(prepared, tile, routes, x.dtype, x.device, gated=gated,
                                               weighted=weighted)
        flat = x.dim() == 2
        rows = x if flat else x.reshape(-1, layout.shape[1])
        stride = rows.stride()
        if stride[1] != 1 or stride[0] % 8:
            rows = rows.contiguous()
            stride = rows.stride()
        # The sizes as arguments, not one tuple: torch parses them faster (docs/triton-launch.md).
        y = torch.empty(t, topk, bucket.cols, dtype=bucket.y_dtype, device=bucket.device)
        # The kernels read the ids as given (int32 or int64) and the weights as float32,
        # each contiguous: no copy where they already are.
        ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
        rw = topk_weights.to(torch.float32, memory_format=torch.contiguous_format) if topk_weights is not None else None
        bucket(rows, stride[0], ids, routes, topk if flat else 1, rw, y)
        if weighted:
            return y.sum(dim=1).to(x.dtype)
        return y.to(x.dtype) if bucket.rounds else y  # Tensor.to parses its arguments even when it is a no-op

    def _bucket(self, prepared: TritonMoEWeights, tile: MoETile, routes: int, x_dtype: torch.dtype,
                device: torch.device, *, gated: bool, weighted: bool) -> Any:
        """A new bucket of ``tile`` for this call (:mod:`.triton_launch`)."""
        card, sms = _facts(device)
        return _launcher().Bucket(prepared, tile, routes, device, sms=sms, wgmma=uses_wgmma(card),
                                  interpreted=interpreted(), gated=gated, weighted=weighted, x_dtype=x_dtype)


#: Where a weight's launch state keeps its route points (:func:`_route_points`), beside the
#: buckets.
_ROUTE_POINTS = "route points"


def _route_points(prepared: TritonMoEWeights, device: torch.device) -> tuple[tuple[int, ...], CardKey | None]:
    """The route counts at which a call's bucket changes for this weight on ``device``,
    sorted, and the card the tile table was read for. A bucket fixes the tile, which
    follows the routes per expert against the table's limits (:func:`.tiles.pick_tile`)
    and whether the routes exceed ``SMALL_MAX_ROUTES`` or ``ONE_LAUNCH_MAX_ROUTES``; and
    the kernels' compile-time route bounds, the power of two at or above the routes from 16
    on. So two calls share a bucket when no point lies in ``[routes, routes')``: a call's
    bucket is its route count's index among the points (one bisection)."""
    card, _ = _facts(device)
    points = {SMALL_MAX_ROUTES, ONE_LAUNCH_MAX_ROUTES, *(1 << j for j in range(4, 63))}
    if not interpreted():
        e = max(1, prepared.num_experts)
        points.update(limit * e for limit, _ in tile_table(card))
    return tuple(sorted(points)), card


@functools.cache
def _launcher() -> Any:
    """:mod:`.triton_launch`, imported on the first call (it imports triton)."""
    from . import triton_launch

    return triton_launch


__all__ += ["SMALL_MAX_ROUTES"]
