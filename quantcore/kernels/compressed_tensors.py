"""A GPTQ kernel for compressed-tensors pack-quantized weights.

A :class:`ViaGPTQ` kernel is a GPTQ kernel behind
:class:`~quantcore.transforms.compressed_gptq.CompressedToGPTQ`: ``prepare`` moves the
pack-quantized fields into GPTQ v2's layout (bit-exact, nothing recomputed) and hands
them to the GPTQ kernel's own ``prepare``; everything the selection asks of a kernel
(device, support, cost, priority) is the GPTQ kernel's answer for the same weight as GPTQ.
Each GPTQ backend registers ``via_gptq(its kernel)`` beside the kernel itself, so the
conformance matrix checks every GPTQ kernel on compressed-tensors cases as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from quantcore.cost import Cost
from quantcore.errors import UnsupportedProblemError
from quantcore.formats.compressed_tensors import CompressedTensors
from quantcore.kernel import LinearKernel, Support
from quantcore.probe import Capabilities
from quantcore.problem import Problem
from quantcore.tensors import stored_on
from quantcore.transforms.compressed_gptq import CompressedToGPTQ, gptq_format_for_compressed

__all__ = ["ViaGPTQ", "via_gptq"]


def _as_gptq(problem: Problem) -> Problem | None:
    fmt = problem.format
    if not isinstance(fmt, CompressedTensors):
        return None
    return Problem.of(gptq_format_for_compressed(fmt), dict(problem.dims), problem.act_dtype, op=problem.op)


class ViaGPTQ(LinearKernel):
    """A GPTQ kernel (``inner``) running pack-quantized weights."""

    format: ClassVar[str] = CompressedTensors.name
    inner: ClassVar[type[LinearKernel]]

    def __init__(self, fmt: Any, device: str | torch.device) -> None:
        super().__init__(fmt, device)
        self.transform = CompressedToGPTQ(fmt)
        self.gptq = self.inner(self.transform.target, device)

    @classmethod
    def check_device(cls, caps: Capabilities) -> str | None:
        return cls.inner.check_device(caps)

    @classmethod
    def priority_on(cls, caps: Capabilities) -> int:
        return cls.inner.priority_on(caps)

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        gptq = _as_gptq(problem)
        if gptq is None:
            return Support.no(f"format {problem.format.slug} is not compressed-tensors pack-quantized")
        return cls.inner.supports(gptq)

    @classmethod
    def cost(cls, caps: Capabilities, problem: Problem) -> Cost | None:
        gptq = _as_gptq(problem)
        return cls.inner.cost(caps, gptq) if gptq is not None else None

    def prepare(self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None) -> Any:
        tensors = stored_on(tensors, self.device, where=f"{self.name} prepare")
        return self.gptq.prepare(self.transform.apply(tensors), dtype=dtype)

    def prepared_schema(self, dims: Mapping[str, int]) -> Any:
        return self.gptq.prepared_schema(dims)

    def __call__(self, x: torch.Tensor, prepared: Any) -> torch.Tensor:
        return self.gptq(x, prepared)  # type: ignore[operator]


def via_gptq(inner: type[LinearKernel]) -> type[ViaGPTQ]:
    """The compressed-tensors kernel of one GPTQ kernel class (same name, same rank)."""
    if inner.format != "gptq" or inner.op != "linear":
        raise UnsupportedProblemError(f"via_gptq: {inner.__name__} is a {inner.format}/{inner.op} kernel, not gptq/linear")
    attrs = {name: getattr(inner, name) for name in ("name", "priority", "keeps_dense_weight", "requires")}
    attrs.update(inner=inner, description=f"{inner.description} (pack-quantized moved into GPTQ's layout)",
                 __module__=__name__)
    return type(f"{inner.__name__}ForCompressedTensors", (ViaGPTQ,), attrs)

