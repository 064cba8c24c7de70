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

from collections.abc import Mapping

import torch

from ...formats.base import Format
from ...problem import Problem
from ..op import Op
from .harness import HARNESS
from .kernel import ROUTE_ID_DTYPES, MoEKernel, check_routing, moe_ffn
from .reference import ExpertsLike, moe_ffn_reference, moe_gemm_reference, swiglu

__all__ = [
    "OP",
    "ROUTE_ID_DTYPES",
    "ExpertsLike",
    "MoEKernel",
    "check_routing",
    "moe_ffn",
    "moe_ffn_reference",
    "moe_gemm_reference",
    "moe_problem",
    "swiglu",
]


def _output(
    fmt: Format, dims: Mapping[str, int], x: torch.Tensor, topk_ids: torch.Tensor,
    topk_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    t, topk = topk_ids.shape
    n = dims["N"]
    return x.new_empty((t, n) if topk_weights is not None else (t, topk, n))


OP = Op(
    name="moe",
    dims=("T", "E", "topk", "K", "N"),
    weight_dims=("E", "K", "N"),
    doc="y[T, topk, N] = x @ W[topk_ids] per route; with topk_weights, their weighted sum [T, N]",
    inputs=("x", "topk_ids"),
    options=("topk_weights",),
    output=_output,
    harness=HARNESS,
)


def moe_problem(
    format: Format, *, T: int, E: int, topk: int, K: int, N: int, dtype: torch.dtype = torch.bfloat16
) -> Problem:
    return Problem.of(format, {"T": T, "E": E, "topk": topk, "K": K, "N": N}, dtype, op="moe")
