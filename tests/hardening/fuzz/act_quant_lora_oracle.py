"""The ``act_quant_lora`` oracle (SVDQuant pre-GEMM): the op is not a linear map, so its
golden output has two parts, judged as the conformance harness judges them, widened to
the inputs a fuzz makes.

* ``qout`` and ``oscales`` bit for bit against the format's golden quantizer (the
  harness's own checks), which
  defines the bytes for every input, NaN and Inf included (the block's scale is NaN, its
  codes 0);
* ``lora_act_out``: the M real rows against ``x @ lora_down`` in float64 through
  :func:`judge_dense` (float32 accumulation; NaN/Inf where the exact result is; overflow
  and subnormals allowed for as for a linear), the padding rows exactly 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from hypothesis import strategies as st

from quantcore.formats.base import Format
from quantcore.formats.svdquant import SVDQuantAct
from quantcore.kernel import Kernel
from quantcore.ops.act_quant_lora import ActQuantLoraOutput, act_quant_lora_reference
from quantcore.ops.act_quant_lora.harness import code_problems, layout_problem

from .mutations import mutate_activation
from .oracles import Inputs, OpOracle, beyond, has_tiny, judge_dense, on_cpu, x_draw

__all__ = ["ActQuantLoraOracle"]

LORA_DTYPE = torch.float32


class ActQuantLoraOracle(OpOracle):
    op = "act_quant_lora"
    arg_names = ("x", "prepared", "dtype")
    writes_format = True

    def nominal(self, data: st.DataObject, dims: Mapping[str, int], act_dtype: torch.dtype) -> Inputs:
        m = data.draw(st.sampled_from((1, 2, 3, 5, 17)), label="M")
        return {"x": x_draw(data, (m,), dims["N"], act_dtype)}

    @staticmethod
    def _layer(tensors: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        smooth = tensors.get("smooth")
        return tensors["lora_down"].detach().cpu(), smooth.detach().cpu() if smooth is not None else None

    def golden(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> ActQuantLoraOutput:
        assert isinstance(fmt, SVDQuantAct)
        lora_down, smooth = self._layer(tensors)
        return act_quant_lora_reference(fmt, inputs["x"].detach().cpu(), lora_down, smooth)

    def outputs(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> dict[str, torch.Tensor]:
        """The format's golden quantizer on ``x`` (as given: any device, dtype, shape)."""
        return fmt.quantize(inputs["x"], smooth=tensors.get("smooth"))  # type: ignore[call-arg]

    def check_outputs(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs, out: Any) -> str | None:
        """What the golden quantizer wrote for an ``x`` it accepted: outputs its own
        validator takes, padding rows 0, a block with a NaN/Inf in ``x / smooth`` NaN,
        and the finite blocks no further from ``x / smooth`` than zero is (a saturated
        INT4 scale, stored as +inf by the format's rule, excepted)."""
        assert isinstance(fmt, SVDQuantAct)
        try:
            m_pad, n = fmt.validate_output(out)
        except Exception as exc:
            return f"the golden quantizer wrote outputs its validator refuses: {exc}"
        x = inputs["x"].detach().cpu()
        m = x.shape[0]
        v = x.float()
        if tensors.get("smooth") is not None:
            v = v * (1.0 / tensors["smooth"].detach().cpu().float())
        deq = fmt.dequantize(out).cpu()
        if deq[m:].numel() and (deq[m:] != 0).any():
            return f"non-zero padding rows {m}..{m_pad}"
        blocks = v.double().view(m, n // fmt.block, fmt.block)
        got = deq[:m].view(m, n // fmt.block, fmt.block)
        bad = ~torch.isfinite(blocks).all(dim=-1)
        if not got[bad].isnan().all():
            return f"{int(bad.sum())} block(s) with NaN/Inf in x / smooth not dequantized to NaN"
        overflow = (blocks.abs().amax(dim=-1) / 7 > torch.finfo(torch.float16).max) if not fmt.fp4 else torch.zeros_like(bad)
        finite = ~bad & torch.isfinite(got).all(dim=-1)
        if (~bad & ~finite & ~overflow).any():
            return f"{int((~bad & ~finite & ~overflow).sum())} finite block(s) dequantized to NaN/Inf"
        want, have = blocks[finite], got[finite]
        if (have - want).norm() > want.norm() * (1 + 1e-6) + 1e-300:
            return f"relative error {((have - want).norm() / want.norm()).item():.3g} > 1 (worse than all zeros)"
        return None

    def call(self, kernel: Kernel, prepared: Any, inputs: Inputs) -> Any:
        return kernel(inputs["x"], prepared)  # type: ignore[operator]

    def mutate(self, data: st.DataObject, inputs: Inputs, dims: Mapping[str, int]) -> tuple[str, Inputs]:
        desc, x = mutate_activation(data, "x", inputs["x"])
        return desc, {"x": x}

    def _bound(self, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``|x|``, ``|lora_down|`` as kernels use it (in x's dtype) and ``|x| @ |lora_down|``."""
        x = inputs["x"].detach().cpu()
        lora = self._layer(tensors)[0].to(x.dtype).double().nan_to_num(0.0, 0.0, 0.0).abs()
        xa = x.double().nan_to_num(0.0, 0.0, 0.0).abs()
        return xa, lora, xa @ lora

    def may_overflow(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> bool:
        xa, lora, bound = self._bound(tensors, inputs)
        return beyond(bound, LORA_DTYPE, 64.0) or beyond(lora, LORA_DTYPE, 256.0) or beyond(xa, LORA_DTYPE, 64.0)

    def ranges(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> tuple[bool, torch.Tensor | float]:
        xa, lora, bound = self._bound(tensors, inputs)
        overflow = self.may_overflow(fmt, tensors, inputs)
        if not (has_tiny(xa, LORA_DTYPE) or has_tiny(lora, LORA_DTYPE) or has_tiny(bound, LORA_DTYPE)):
            return overflow, 0.0
        # Each product may lose everything below float32's smallest normal (flush to zero).
        return overflow, torch.finfo(LORA_DTYPE).smallest_normal * (1.0 + xa.sum(dim=1, keepdim=True))

    def apriori(self, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> tuple[torch.Tensor, int] | None:
        _, lora, bound = self._bound(tensors, inputs)
        return bound, lora.shape[0]

    def judge(self, out: Any, fmt: Format, tensors: Mapping[str, torch.Tensor], inputs: Inputs) -> str | None:
        assert isinstance(fmt, SVDQuantAct)
        tensors, inputs = on_cpu(tensors), on_cpu(inputs)
        golden = self.golden(fmt, tensors, inputs)
        problem = layout_problem(out, golden, fmt) or "; ".join(code_problems(out, golden))
        if problem:
            return problem
        m = inputs["x"].shape[0]
        lora = out[2].detach().cpu()
        if lora[m:].numel() and (lora[m:] != 0).any():
            return f"lora_act_out: {int((lora[m:] != 0).sum())} non-zero element(s) in the padding rows {m}.."
        overflow, atol = self.ranges(fmt, tensors, inputs)
        problem = judge_dense(lora[:m], golden.lora_act_out[:m], LORA_DTYPE, may_overflow=overflow, atol=atol,
                              apriori=self.apriori(fmt, tensors, inputs))
        return f"lora_act_out: {problem}" if problem else None
