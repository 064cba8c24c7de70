"""Per-op harnesses: how a case's inputs and golden output are drawn, how a kernel is run
on them and how its output is judged (the golden judge). Each op kind's folder holds its
own (``quantcore/ops/<name>/harness.py``, declared as ``Op.harness``); the conformance
matrix and tuning share them and are op-agnostic."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch

from quantcore.kernel import Kernel

from .case import Case
from .kinds import get_op
from .tolerance import Comparison

__all__ = ["OpHarness", "get_harness"]


class OpHarness(ABC):
    op: str
    #: Boolean case options that add to what :meth:`weights` draws (a linear's ``bias``, a
    #: MoE's second GEMM): part of ``Case.weight_key``, and the variants a derived prepared
    #: schema is made of.
    weight_options: tuple[str, ...] = ()

    @abstractmethod
    def weights(self, case: Case) -> Any:
        """The stored tensors (and whatever golden data depends on them only). Cached
        per ``case.weight_key``, so keep it a function of the weight-defining fields
        (seeded from ``case.seed_key``)."""

    def stored(self, weights: Any) -> Mapping[str, torch.Tensor]:
        """The stored tensors of one weight in what :meth:`weights` returned (what a
        kernel's ``prepare`` takes)."""
        return weights.tensors  # type: ignore[no-any-return]

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
    """The harness of op kind ``op``."""
    return get_op(op).harness
