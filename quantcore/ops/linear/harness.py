"""The ``linear`` harness: random dense W, golden quantize, float64 golden output."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantcore.kernel import Kernel

from ..case import Case
from ..harness import OpHarness
from ..tolerance import Comparison, judge_output
from .reference import linear_reference

__all__ = ["HARNESS", "LinearHarness"]


@dataclass(frozen=True)
class LinearWeights:
    tensors: dict[str, torch.Tensor]
    dense64: torch.Tensor  # the golden dequantization, [N, K] float64


@dataclass(frozen=True)
class LinearInputs:
    x: torch.Tensor
    golden: torch.Tensor  # float64 [M, N]


class LinearHarness(OpHarness):
    op = "linear"
    weight_options = ("bias",)

    def weights(self, case: Case) -> LinearWeights:
        k, n = case.problem["K"], case.problem["N"]
        gen = case.generator(f"{case.seed_key}/W")
        weight = torch.randn(n, k, generator=gen) * 0.05
        tensors = dict(case.format.quantize(weight, generator=gen))
        if case.option("bias"):
            tensors["bias"] = (torch.randn(n, generator=gen) * 0.1).to(torch.float16)
        dense = case.format.dequantize(tensors, dtype=torch.float64)
        return LinearWeights(tensors, dense)

    def inputs(self, case: Case, weights: LinearWeights) -> LinearInputs:
        m, k = case.problem["M"], case.problem["K"]
        x = torch.randn(m, k, generator=case.generator(f"{case.id}/x")).to(case.act_dtype)
        return LinearInputs(x, linear_reference(x, weights.dense64, weights.tensors.get("bias")))

    def prepare(self, kernel: Kernel, case: Case, weights: LinearWeights) -> object:
        tensors = {name: t.to(kernel.device) for name, t in weights.tensors.items()}
        return kernel.prepare(tensors, dtype=case.act_dtype)

    def run(self, kernel: Kernel, prepared: object, case: Case, inputs: LinearInputs) -> torch.Tensor:
        return kernel(inputs.x.to(kernel.device), prepared)

    def judge(self, output: torch.Tensor, case: Case, inputs: LinearInputs) -> Comparison:
        return judge_output(output, inputs.golden, case.act_dtype)


HARNESS = LinearHarness()
