"""The ``act_quant_lora`` harness (SVDQuant pre-GEMM): codes and scales bit for bit,
``lora_act_out`` within float32 tolerance.

Weights: ``lora_down [N, R]`` and ``smooth [N]`` drawn in float32 and stored in bf16
(whose values fp16 holds exactly at these magnitudes, so one draw serves both activation
dtypes). Case option ``smooth``: pass ``smooth`` (such cases use their own seed, so
their cached weights and prepared state are their own).

Activations: ``randn · 2`` with, so that every cell also meets the rounding rules' hard
cases, the first block of each row (N permitting) replaced by exact ties — E2M1
midpoints for NVFP4 (amax 6 makes the scale 1), ``k + ½`` for INT4 (amax 7 makes
``7 / amax`` 1) — with signs mixed, and the last row (M > 1) all zeros. With ``smooth``
the ties are those of ``x · (1/smooth)``, i.e. generic values.

Judgement: ``qout`` and ``oscales`` must equal the golden bytes (any tie-breaking
difference is a FAIL, with the count and the first difference); ``lora_act_out`` must be
float32 ``[M_pad, R]``: its M real rows within the float32 policy of :mod:`..tolerance`
against the float64 golden, its padding rows exactly 0. (Judging the padded tensor as a
whole would let the zero rows shrink ``rms(ref)`` — by 16× at M = 1 — and so tighten the
max-error bound far below the policy's.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantcore.formats.svdquant import SVDQuantAct
from quantcore.kernel import Kernel

from ..case import Case
from ..harness import OpHarness
from ..tolerance import Comparison, compare, tolerance_for
from .reference import ActQuantLoraOutput, act_quant_lora_reference

__all__ = ["HARNESS", "ActQuantLoraHarness", "code_problems", "compare_outputs", "first_difference", "layout_problem", "tie_block"]

NVFP4_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0)
INT4_TIES = (0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.0)


def tie_block(fp4: bool, rows: int, gen: torch.Generator) -> torch.Tensor:
    """``[rows, block]`` of exact tie values whose amax makes the scale 1 (each row holds
    the amax once, and a random sign per entry)."""
    ties = torch.tensor(NVFP4_TIES if fp4 else INT4_TIES)
    block = 16 if fp4 else 64
    idx = torch.randint(0, len(ties), (rows, block), generator=gen)
    idx[:, 0] = len(ties) - 1  # the amax: 6 or 7
    perm = torch.rand(rows, block, generator=gen).argsort(dim=1)
    vals = torch.gather(ties[idx], 1, perm)
    signs = torch.where(torch.rand(rows, block, generator=gen) < 0.5, -1.0, 1.0)
    return vals * signs


@dataclass(frozen=True)
class LayerWeights:
    tensors: dict[str, torch.Tensor]


@dataclass(frozen=True)
class ActInputs:
    x: torch.Tensor
    golden: ActQuantLoraOutput


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a 1- or 2-byte tensor (codes, fp8 or fp16 scales), on the CPU."""
    t = t.detach().cpu()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def first_difference(name: str, got: torch.Tensor, want: torch.Tensor) -> str:
    """``""`` if ``got`` and ``want`` hold the same bits, else how many differ and the first."""
    g, w = _bits(got), _bits(want)
    diff = g != w
    count = int(diff.sum())
    if not count:
        return ""
    where = tuple(int(i) for i in diff.nonzero()[0])
    return (f"{name}: {count} of {w.numel()} differ (first at {list(where)}: got "
            f"{int(g[where]):#x}, expected {int(w[where]):#x})")


def layout_problem(output: object, golden: ActQuantLoraOutput, fmt: SVDQuantAct) -> str:
    """``""`` if ``output`` is ``(qout, oscales, lora_act_out)`` with the golden shapes
    and dtypes, else what is wrong."""
    if not isinstance(output, tuple) or len(output) != 3:
        return f"returned {type(output).__name__}, not (qout, oscales, lora_act_out)"
    expected = {"qout": (golden.qout, torch.uint8), "oscales": (golden.oscales, fmt.scale_dtype),
                "lora_act_out": (golden.lora_act_out, torch.float32)}
    for name, t in zip(expected, output, strict=True):
        want, dtype = expected[name]
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(want.shape) or t.dtype != dtype:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            return f"{name}: expected {tuple(want.shape)} {dtype}, got {got}"
    return ""


def code_problems(output: tuple[torch.Tensor, ...], golden: ActQuantLoraOutput) -> list[str]:
    """Where the codes and scales of a well-laid-out output differ from the golden bits."""
    found = [first_difference("qout", output[0], golden.qout), first_difference("oscales", output[1], golden.oscales)]
    return [p for p in found if p]


def compare_outputs(output: object, golden: ActQuantLoraOutput, fmt: SVDQuantAct, m: int) -> Comparison:
    """Codes and scales exactly (as bytes / bit patterns), the LoRA branch in float32."""
    tol = tolerance_for(torch.float32)
    nan = float("nan")
    layout = layout_problem(output, golden, fmt)
    if layout:
        return Comparison(False, nan, nan, tol, layout)
    assert isinstance(output, tuple)
    lora = output[2]
    problems = code_problems(output, golden)
    lora_cmp = compare(lora[:m], golden.lora_act_out[:m], tol)
    if not lora_cmp.ok:
        problems.append(f"lora_act_out: {lora_cmp.problem}")
    padding = lora[m:].detach().cpu()
    if padding.numel() and (padding != 0).any():
        problems.append(f"lora_act_out: {int((padding != 0).sum())} nonzero element(s) in the padding rows {m}..")
    problem = "; ".join(problems)
    return Comparison(not problem, lora_cmp.rel_err, lora_cmp.max_err, tol, problem)


class ActQuantLoraHarness(OpHarness):
    op = "act_quant_lora"
    weight_options = ("smooth",)

    def weights(self, case: Case) -> LayerWeights:
        n, r = case.problem["N"], case.problem["R"]
        gen = case.generator(f"{case.seed_key}/W")
        tensors = {"lora_down": (torch.randn(n, r, generator=gen) * 0.05).to(torch.bfloat16)}
        if case.option("smooth"):
            tensors["smooth"] = torch.exp(torch.randn(n, generator=gen) * 0.5).to(torch.bfloat16)
        return LayerWeights(tensors)

    def inputs(self, case: Case, weights: LayerWeights) -> ActInputs:
        fmt = case.format
        assert isinstance(fmt, SVDQuantAct)
        m, n = case.problem["M"], case.problem["N"]
        gen = case.generator(f"{case.id}/x")
        x = torch.randn(m, n, generator=gen) * 2
        if n >= 2 * fmt.block:
            x[:, : fmt.block] = tie_block(fmt.fp4, m, gen)
        if m > 1:
            x[-1] = 0
        x = x.to(case.act_dtype)
        golden = act_quant_lora_reference(fmt, x, weights.tensors["lora_down"], weights.tensors.get("smooth"))
        return ActInputs(x, golden)

    def prepare(self, kernel: Kernel, case: Case, weights: LayerWeights) -> object:
        tensors = {name: t.to(kernel.device) for name, t in weights.tensors.items()}
        return kernel.prepare(tensors, dtype=case.act_dtype)

    def run(self, kernel: Kernel, prepared: object, case: Case, inputs: ActInputs) -> object:
        return kernel(inputs.x.to(kernel.device), prepared)

    def judge(self, output: object, case: Case, inputs: ActInputs) -> Comparison:
        assert isinstance(case.format, SVDQuantAct)
        return compare_outputs(output, inputs.golden, case.format, case.problem["M"])


HARNESS = ActQuantLoraHarness()
