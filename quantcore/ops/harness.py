"""Per-op harnesses: how a case's inputs and golden output are drawn, how a kernel is run
on them and how its output is judged (the golden judge). The conformance matrix and tuning
share them; both are op-agnostic."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any

from quantcore.kernel import Kernel

from .case import Case
from .tolerance import Comparison

__all__ = ["OpHarness", "get_harness"]


class OpHarness(ABC):
    op: str

    @abstractmethod
    def weights(self, case: Case) -> Any:
        """The stored tensors (and whatever golden data depends on them only). Cached
        per ``case.weight_key``, so keep it a function of the weight-defining fields."""

    @abstractmethod
    def inputs(self, case: Case, weights: Any) -> Any:
        """Activations and the float64 golden output for this case."""

    @abstractmethod
    def prepare(self, kernel: Kernel, case: Case, weights: Any) -> Any:
        """``kernel.prepare`` on the case's device."""

    @abstractmethod
    def run(self, kernel: Kernel, prepared: Any, case: Case, inputs: Any) -> Any: ...

    @abstractmethod
    def judge(self, output: Any, case: Case, inputs: Any) -> Comparison: ...


def get_harness(op: str) -> OpHarness:
    """The harness of ``op``: module ``quantcore.ops.harnesses.<op>``, attribute
    ``HARNESS``. One module per op keeps ops independent of each other."""
    hit = _HARNESSES.get(op)
    if hit is None:
        try:
            module = importlib.import_module(f"{__package__}.harnesses.{op}")
        except ModuleNotFoundError as exc:
            raise KeyError(f"no conformance harness for op {op!r} ({exc})") from None
        hit = _HARNESSES[op] = module.HARNESS
    return hit


_HARNESSES: dict[str, OpHarness] = {}
