"""Tiny kernels and plugins for testing the registry and selection machinery."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from quantcore.kernel import LinearKernel, Requirements, Support
from quantcore.problem import Problem
from quantcore.registry import hookimpl

CPU = Requirements(device_types=frozenset({"cpu"}))


def dense_kernel(name: str, *, priority: int = 50, scale: float = 1.0, fmt: str = "gptq") -> type[LinearKernel]:
    """A GPTQ kernel that dequantizes with the golden code; ``scale`` != 1 makes it wrong."""

    class Dense(LinearKernel):
        format: ClassVar[str] = fmt
        requires: ClassVar[Requirements] = CPU

        def prepare(self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None) -> Any:
            return self.fmt.dequantize(tensors, dtype=torch.float32) * scale

        def __call__(self, x: torch.Tensor, prepared: Any) -> torch.Tensor:
            return (x.float() @ prepared.T).to(x.dtype)

    Dense.name = name
    Dense.priority = priority
    Dense.__name__ = f"Dense_{name}"
    return Dense


class Plugin:
    """A plugin object contributing the given kernels."""

    def __init__(self, *kernels: Any) -> None:
        self._kernels = list(kernels)

    @hookimpl
    def quantcore_kernels(self) -> list[Any]:
        return self._kernels


class RaisingHook:
    @hookimpl
    def quantcore_kernels(self) -> list[Any]:
        raise RuntimeError("vendor library not initialised")


def refusing_kernel(name: str, reason: str, *, priority: int = 90) -> type[LinearKernel]:
    k = dense_kernel(name, priority=priority)

    @classmethod  # type: ignore[misc]
    def supports(cls: Any, problem: Problem) -> Support:
        return Support.no(reason)

    k.supports = supports  # type: ignore[method-assign]
    return k


def costed_kernel(name: str, *, bandwidth: float, compute: float, priority: int = 50, dense: bool = False,
                  launches: int = 1) -> type[LinearKernel]:
    """A correct GPTQ kernel that declares a roofline cost: ``bandwidth`` and ``compute``
    shares, moving the 4-bit weight (or a bf16 one when ``dense``)."""
    from quantcore.cost import linear_cost

    k = dense_kernel(name, priority=priority)

    @classmethod  # type: ignore[misc]
    def cost(cls: Any, caps: Any, problem: Problem) -> Any:
        bits = 16 if dense else 4
        weight = problem["K"] * problem["N"] * bits / 8
        return linear_cost(problem, weight, bandwidth=bandwidth, compute=compute, launches=launches)

    k.cost = cost  # type: ignore[method-assign]
    k.keeps_dense_weight = dense  # type: ignore[misc]
    return k
