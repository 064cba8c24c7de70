"""``moe``: the routed expert GEMM of a mixture-of-experts layer, and the FFN built from it.

Routing is given, not computed: each of T tokens carries ``topk`` expert ids
``topk_ids [T, topk]`` (in ``[0, E)``) and, where a weighted sum is asked for, weights
``topk_weights [T, topk]``. A *route* is one (token, slot) pair, ``r = t · topk + j``.

The routed GEMM, with expert weights ``W [E, K, N]`` dequantized from the format::

    y[t, j, :] = x_r @ W[topk_ids[t, j]]          → [T, topk, N]
    x_r = x[t]        when x is [T, K]           (GEMM1: every route of a token reads it)
    x_r = x[t, j]     when x is [T, topk, K]     (GEMM2: one row per route)
    with topk_weights: out[t, :] = Σ_j topk_weights[t, j] · y[t, j, :]   → [T, N]

The FFN (TensorRT-LLM's gated MoE, ``runMoe``), from W1 ``[E, K, 2·I]`` and W2
``[E, I, K]``::

    h = routed_gemm(x, W1)                          [T, topk, 2·I]
    a = h[..., :I] · SiLU(h[..., I:])               SwiGLU, linear half first, gate second
    out = routed_gemm(a, W2, topk_weights)          [T, K]

The halves follow TensorRT-LLM (``doGatedActivationKernel``: ``fc1 = gemm[i]``,
``gate = gemm[i + inter]``, out = fc1 · SiLU(gate)), which is why its loaders
concatenate W3 (up) before W1 (gate).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar, Protocol

import torch

from ..errors import KernelInputError
from ..formats.base import Format
from ..kernel import Kernel
from ..problem import Problem
from ..tensors import describe
from .base import Op

__all__ = [
    "MOE",
    "MoEKernel",
    "check_routing",
    "moe_ffn",
    "moe_ffn_reference",
    "moe_gemm_reference",
    "moe_problem",
    "swiglu",
]

MOE = Op(
    name="moe",
    dims=("T", "E", "topk", "K", "N"),
    doc="y[T, topk, N] = x @ W[topk_ids] per route; with topk_weights, their weighted sum [T, N]",
)

ROUTE_ID_DTYPES = (torch.int32, torch.int64)


class ExpertsLike(Protocol):
    """Expert weights indexable by expert id: ``weight[e]`` is a dense ``[K, N]``."""

    def __getitem__(self, e: int) -> torch.Tensor: ...


def moe_problem(
    format: Format, *, T: int, E: int, topk: int, K: int, N: int, dtype: torch.dtype = torch.bfloat16
) -> Problem:
    return Problem.of(format, {"T": T, "E": E, "topk": topk, "K": K, "N": N}, dtype, op="moe")


# --- golden references (float64) -------------------------------------------------------------


def _route_rows(x: torch.Tensor, topk: int) -> torch.Tensor:
    """The activation row of every route, ``[T · topk, K]``."""
    if x.dim() == 2:
        return x.repeat_interleave(topk, dim=0)
    return x.reshape(-1, x.shape[-1])


def moe_gemm_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    weight: ExpertsLike,
    topk_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """The golden routed GEMM in float64. ``weight`` is the dense ``[E, K, N]``, or
    anything whose ``weight[e]`` is expert e's dense ``[K, N]`` (so large golden
    weights can be materialised one expert at a time)."""
    t, topk = topk_ids.shape
    rows = _route_rows(x.double(), topk)
    ids = topk_ids.reshape(-1).long()
    parts: dict[int, torch.Tensor] = {}
    for e in torch.unique(ids).tolist():
        parts[e] = rows[ids == e] @ weight[e].to(device=rows.device, dtype=torch.float64)
    n = next(iter(parts.values())).shape[1]
    y = torch.empty(rows.shape[0], n, dtype=torch.float64, device=rows.device)
    for e, part in parts.items():
        y[ids == e] = part
    y = y.view(t, topk, n)
    if topk_weights is None:
        return y
    return (y * topk_weights.double().unsqueeze(-1)).sum(dim=1)


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """TensorRT-LLM's SwiGLU on ``[..., 2·I]``: linear half first, gate half second."""
    inter = h.shape[-1] // 2
    return h[..., :inter] * torch.nn.functional.silu(h[..., inter:])


def moe_ffn_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w1: ExpertsLike,
    w2: ExpertsLike,
) -> torch.Tensor:
    """The golden gated FFN in float64 (no rounding between the stages)."""
    h = moe_gemm_reference(x, topk_ids, w1)
    return moe_gemm_reference(swiglu(h), topk_ids, w2, topk_weights)


# --- kernels ----------------------------------------------------------------------------------


class MoEKernel(Kernel):
    """Runs the routed GEMM for one format; see the module docstring for the contract."""

    op: ClassVar[str] = "moe"

    @abstractmethod
    def __call__(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        prepared: Any,
        *,
        topk_weights: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def gated(self, x: torch.Tensor, topk_ids: torch.Tensor, prepared: Any) -> torch.Tensor:
        """The FFN's first GEMM and its SwiGLU: ``[T, topk, N/2]`` in x's dtype. The
        default rounds the GEMM to x's dtype, runs the SwiGLU in float32 and rounds its
        result, as TensorRT-LLM's separate gated-activation kernel does; a kernel that
        fuses the SwiGLU into its epilogue overrides this (one rounding, no ``[T, topk,
        N]`` round trip)."""
        return swiglu(self(x, topk_ids, prepared).float()).to(x.dtype)


def check_routing(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor | None,
    *,
    num_experts: int,
    k: int,
    dtypes: tuple[torch.dtype, ...],
    device: torch.device,
    check_ids: bool = True,
) -> tuple[int, int]:
    """Validate a routed-GEMM call; returns ``(T, topk)``. ``check_ids`` reads the ids'
    range, which on a GPU waits for them: kernels may skip it only where an out-of-range
    id cannot produce a silently wrong result."""
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2 or topk_ids.dtype not in ROUTE_ID_DTYPES:
        got = describe(topk_ids) if isinstance(topk_ids, torch.Tensor) else type(topk_ids).__name__
        raise KernelInputError(f"topk_ids: expected a 2-D int32/int64 [T, topk] tensor, got {got}")
    t, topk = topk_ids.shape
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    shapes = ((t, k), (t, topk, k))
    if tuple(x.shape) not in shapes or x.dtype not in dtypes or x.device != device:
        wanted = " or ".join(str(s) for s in shapes)
        names = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        raise KernelInputError(f"x: expected {wanted} {names} on {device}, got {describe(x)}")
    if topk_ids.device != device:
        raise KernelInputError(f"topk_ids: expected on {device}, got {describe(topk_ids)}")
    if topk_weights is not None and (
        not isinstance(topk_weights, torch.Tensor)
        or tuple(topk_weights.shape) != (t, topk)
        or not topk_weights.is_floating_point()
        or topk_weights.device != device
    ):
        got = describe(topk_weights) if isinstance(topk_weights, torch.Tensor) else type(topk_weights).__name__
        raise KernelInputError(f"topk_weights: expected a float ({t}, {topk}) tensor on {device}, got {got}")
    if check_ids and topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < 0 or hi >= num_experts:
            raise KernelInputError(
                f"topk_ids: expected expert ids in [0, {num_experts}), got values in [{lo}, {hi}]"
            )
    return t, topk


def moe_ffn(
    kernel: MoEKernel,
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    prepared_w1: Any,
    prepared_w2: Any,
) -> torch.Tensor:
    """The gated FFN from two routed GEMMs of one kernel: :meth:`MoEKernel.gated` (the
    first GEMM and the SwiGLU, rounded to the activation dtype as TensorRT-LLM's gated
    activation kernel stores it), then the weighted second GEMM."""
    a = kernel.gated(x, topk_ids, prepared_w1)
    return kernel(a, topk_ids, prepared_w2, topk_weights=topk_weights)
