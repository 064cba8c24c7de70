"""The ``moe`` harness: random experts, golden quantize, a random routing, float64 golden.

Case options:

``weighted``   pass ``topk_weights``: the output is the weighted sum ``[T, N]``
``per_route``  x is ``[T, topk, K]`` (one row per route, as GEMM2 reads it)
``ffn``        the gated FFN (:func:`quantcore.ops.moe.moe_ffn`): W1 is the case's
               ``[E, K, N]``, W2 ``[E, N/2, K]`` in the same format; output ``[T, K]``

Expert ids are distinct within a token, drawn uniformly; routing weights are a softmax.
The golden dequantizes one expert at a time in float64 (and keeps it, per weights),
so the large shapes fit in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch

from quantcore.formats.base import Format
from quantcore.kernel import Kernel

from ..case import Case
from ..harness import OpHarness
from ..tolerance import Comparison, judge_output
from .kernel import moe_ffn
from .reference import moe_ffn_reference, moe_gemm_reference

__all__ = ["HARNESS", "GoldenExperts", "MoEHarness"]


@dataclass
class GoldenExperts:
    """Stored tensors of ``[E, K, N]`` experts, dequantized lazily, one expert at a time."""

    fmt: Format
    tensors: dict[str, torch.Tensor]
    _dense: dict[int, torch.Tensor] = field(default_factory=dict)

    def __getitem__(self, e: int) -> torch.Tensor:
        hit = self._dense.get(e)
        if hit is None:
            one = {name: t[e : e + 1] for name, t in self.tensors.items()}
            hit = self._dense[e] = self.fmt.dequantize(one, dtype=torch.float64)[0]
        return hit


@dataclass(frozen=True)
class MoEWeights:
    up: GoldenExperts
    down: GoldenExperts | None  # the FFN's W2


@dataclass(frozen=True)
class MoEInputs:
    x: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor | None
    golden: torch.Tensor


def draw_experts(fmt: Format, e: int, k: int, n: int, gen: torch.Generator) -> GoldenExperts:
    # A per-column offset gives the groups a non-zero mean, which asymmetric zeros must carry.
    weight = torch.randn(e, k, n, generator=gen) * 0.05 + torch.randn(e, 1, n, generator=gen) * 0.02
    return GoldenExperts(fmt, dict(fmt.quantize(weight, generator=gen)))


class MoEHarness(OpHarness):
    op = "moe"
    weight_options = ("ffn",)

    def weights(self, case: Case) -> MoEWeights:
        e, k, n = (case.problem[d] for d in ("E", "K", "N"))
        gen = case.generator(f"{case.seed_key}/W")
        up = draw_experts(case.format, e, k, n, gen)
        down = draw_experts(case.format, e, n // 2, k, gen) if case.option("ffn") else None
        return MoEWeights(up, down)

    def inputs(self, case: Case, weights: MoEWeights) -> MoEInputs:
        t, e, topk, k = (case.problem[d] for d in ("T", "E", "topk", "K"))
        gen = case.generator(f"{case.id}/x")
        shape = (t, topk, k) if case.option("per_route") else (t, k)
        x = torch.randn(*shape, generator=gen).to(case.act_dtype)
        topk_ids = torch.rand(t, e, generator=gen).argsort(dim=1)[:, :topk].to(torch.int32)
        topk_weights = torch.softmax(torch.randn(t, topk, generator=gen), dim=-1)
        if case.option("ffn"):
            assert weights.down is not None
            golden = moe_ffn_reference(x, topk_ids, topk_weights, weights.up, weights.down)
            return MoEInputs(x, topk_ids, topk_weights, golden)
        if not case.option("weighted"):
            return MoEInputs(x, topk_ids, None, moe_gemm_reference(x, topk_ids, weights.up, None))
        return MoEInputs(x, topk_ids, topk_weights, moe_gemm_reference(x, topk_ids, weights.up, topk_weights))

    def stored(self, weights: MoEWeights) -> dict[str, torch.Tensor]:
        return weights.up.tensors

    def prepare(self, kernel: Kernel, case: Case, weights: MoEWeights) -> object:
        def one(experts: GoldenExperts) -> object:
            tensors = {name: t.to(kernel.device) for name, t in experts.tensors.items()}
            return kernel.prepare(tensors, dtype=case.act_dtype)

        return (one(weights.up), one(weights.down)) if weights.down is not None else one(weights.up)

    def run(self, kernel: Kernel, prepared: object, case: Case, inputs: MoEInputs) -> torch.Tensor:
        dev = kernel.device
        x, ids = inputs.x.to(dev), inputs.topk_ids.to(dev)
        weights = inputs.topk_weights.to(dev) if inputs.topk_weights is not None else None
        if case.option("ffn"):
            up, down = cast(tuple[Any, Any], prepared)
            return moe_ffn(kernel, x, ids, weights, up, down)  # type: ignore[arg-type]
        return kernel(x, ids, prepared, topk_weights=weights)

    def judge(self, output: torch.Tensor, case: Case, inputs: MoEInputs) -> Comparison:
        return judge_output(output, inputs.golden, case.act_dtype)


HARNESS = MoEHarness()
