"""The base of ``moe`` kernels, the check of a routed call, and the FFN from two calls."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import torch

from ...errors import KernelInputError
from ...kernel import Kernel
from ...tensors import describe
from .reference import swiglu

__all__ = ["ROUTE_ID_DTYPES", "MoEKernel", "check_routing", "moe_ffn"]

ROUTE_ID_DTYPES = (torch.int32, torch.int64)


class MoEKernel(Kernel):
    """Runs the routed GEMM for one format; the contract is in :mod:`quantcore.ops.moe`."""

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
    """Validate a routed-GEMM call; returns ``(T, topk)``.

    ``check_ids`` reads the ids' range on the host and refuses an id outside
    ``[0, num_experts)`` with a :class:`KernelInputError`. On a GPU that read is a
    synchronisation: the host waits for the device's queue to reach the ids, every call.
    A kernel may pass ``check_ids=False`` only where its contract makes an out-of-range id
    loud and harmless: never an out-of-bounds access, and never a plausible wrong number
    (``trtllm_moe_triton`` on CUDA: NaN in the output rows of the routes with such an id,
    backends/trtllm_moe/README.md). Every other check stays."""
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2 or topk_ids.dtype not in ROUTE_ID_DTYPES:
        got = describe(topk_ids) if isinstance(topk_ids, torch.Tensor) else type(topk_ids).__name__
        raise KernelInputError(f"topk_ids: expected a 2-D int32/int64 [T, topk] tensor, got {got}")
    t, topk = topk_ids.shape
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    shapes = ((t, k), (t, topk, k))
    if x.shape not in shapes or x.dtype not in dtypes or x.device != device:  # a torch.Size is a tuple
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
