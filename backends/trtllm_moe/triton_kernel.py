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
        device_types=frozenset({"cuda", "cpu"}), min_capability=(8, 0), packages=("triton",)
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
        check_routing(
            x, topk_ids, topk_weights, num_experts=prepared.num_experts, k=prepared.k,
            dtypes=ACT_DTYPES, device=prepared.layout.device, check_ids=reads_ids(topk_ids),
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
        return self.forward(x, topk_ids, prepared, topk_weights=topk_weights)

    def gated(self, x: torch.Tensor, topk_ids: torch.Tensor, prepared: TritonMoEWeights) -> torch.Tensor:
        """The FFN's first GEMM with TensorRT-LLM's SwiGLU fused into the epilogue:
        ``[T, topk, N/2]`` in the activation dtype (see :meth:`MoEKernel.gated`)."""
        self._checked(x, topk_ids, prepared, None)
        if prepared.n % 64:
            raise KernelInputError(f"gated: N={prepared.n} must be a multiple of 64 (32 SwiGLU columns per tile)")
        return self.forward(x, topk_ids, prepared, gated=True)

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
        t, topk = topk_ids.shape
        _, k, n = prepared.layout.shape
        routes = t * topk
        cols = n // 2 if gated else n
        weighted = topk_weights is not None
        if routes == 0:
            shape = (t, cols) if weighted else (t, topk, cols)
            return torch.zeros(shape, dtype=x.dtype, device=x.device)
        bucket = self._bucket(prepared, routes, x.dtype, x.device, tile, gated=gated, weighted=weighted)
        rows = x if x.dim() == 2 else x.reshape(-1, k)
        if rows.stride(-1) != 1 or rows.stride(0) % 8:
            rows = rows.contiguous()
        # The sizes as arguments, not one tuple: torch parses them faster (docs/triton-launch.md).
        y = torch.empty(t, topk, cols, dtype=bucket.y_dtype, device=x.device)
        # The kernels read the ids as given (int32 or int64) and the weights as float32,
        # each contiguous: no copy where they already are.
        ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
        rw = topk_weights.to(torch.float32, memory_format=torch.contiguous_format) if weighted else None
        bucket(rows, ids, topk if x.dim() == 2 else 1, rw, y)
        if weighted:
            return y.sum(dim=1).to(x.dtype)
        return y if y.dtype == x.dtype else y.to(x.dtype)  # Tensor.to parses its arguments even when it is a no-op

    def _bucket(self, prepared: TritonMoEWeights, routes: int, x_dtype: torch.dtype, device: torch.device,
                tile: MoETile | None, *, gated: bool, weighted: bool) -> Any:
        """The bucket of this call (:mod:`.triton_launch`), kept with the prepared weights."""
        launcher = _launcher()
        # Kept with the layout tensor (the custom op rebuilds the state object at every call).
        state = launcher.launch_state(prepared.layout)
        if tile is None:
            runs = state.get(device)
            if runs is None:
                runs = state[device] = _tile_runs(prepared, device)
            run: object = (bisect.bisect_left(runs[0], routes), routes > SMALL_MAX_ROUTES,
                           routes > ONE_LAUNCH_MAX_ROUTES)
        else:
            run = tile
        key = (run, pow2_at_least(routes, 16), gated, weighted, x_dtype, device)
        bucket = state.get(key)
        if bucket is None or not bucket.fits(prepared):
            if tile is None:
                tile = pick_tile(routes, prepared.num_experts, prepared.k, prepared.group_size,
                                 scale_dtype=prepared.scales.dtype, card=state[device][1],
                                 interpreted=interpreted())
            card, sms = _facts(device)
            bucket = state[key] = launcher.Bucket(prepared, tile, routes, device, sms=sms, wgmma=uses_wgmma(card),
                                                  interpreted=interpreted(), gated=gated, weighted=weighted,
                                                  x_dtype=x_dtype)
        return bucket


def _tile_runs(prepared: TritonMoEWeights, device: torch.device) -> tuple[tuple[float, ...], CardKey | None]:
    """The route counts at which the shipped tile changes for this weight on ``device``
    (:func:`.tiles.pick_tile`: routes per expert against the table's limits) and the card
    the table was read for."""
    card, _ = _facts(device)
    if interpreted():
        return (), card
    e = max(1, prepared.num_experts)
    return tuple(limit * e for limit, _ in tile_table(card)), card


@functools.cache
def _launcher() -> Any:
    """:mod:`.triton_launch`, imported on the first call (it imports triton)."""
    from . import triton_launch

    return triton_launch


__all__ += ["SMALL_MAX_ROUTES"]
