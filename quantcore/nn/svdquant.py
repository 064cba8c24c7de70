"""SVDQuant modules: the W4A4 pre-GEMM as a module (``quantcore::act_quant_lora`` when
traced), and a W4A4 linear that runs it.

quantcore has the pre-GEMM op (activations → 4-bit codes, block scales and the LoRA-down
product, :mod:`quantcore.ops.act_quant_lora`) but no W4A4 GEMM kernel yet, so
:class:`SVDQuantLinear` finishes the layer in plain torch: it decodes the activation codes
and the weight residual's codes (stored 4-bit, in the same format) and multiplies them in
float32, then adds the LoRA branch. Numerically that is the layer (codes × scales are
exact in float32); it is not fast. It exists so a model can run end to end through the
pre-GEMM kernels and be judged for quality.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ..custom_ops import traced
from ..errors import InvalidArgumentError, KernelInputError
from ..formats.svdquant import SVDQuantAct
from ..formats.svdquant.numerics import dequantize_activation
from ..ops.act_quant_lora import ActQuantLoraOutput
from ..problem import Problem
from ..tensors import describe
from .quant_module import QuantModule

__all__ = ["SVDQuantActQuant", "SVDQuantLinear"]


class SVDQuantActQuant(QuantModule):
    """``act_quant_lora`` on a layer's ``lora_down [N, R]`` (and optional ``smooth [N]``):
    ``act(x [M, N]) -> ActQuantLoraOutput(qout, oscales, lora_act_out)``."""

    op_kind = "act_quant_lora"

    def __init__(
        self,
        fmt: SVDQuantAct,
        tensors: Mapping[str, torch.Tensor] | None = None,
        *,
        in_features: int | None = None,
        rank: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.bfloat16,
        prefer: str | Sequence[str] | None = None,
        keep_source: bool = False,
    ) -> None:
        if tensors is None and (in_features is None or rank is None):
            raise InvalidArgumentError("SVDQuantActQuant: give the tensors, or in_features and rank")
        dims = None if tensors is not None else {"N": in_features, "R": rank}
        super().__init__(fmt, tensors, dims=dims, device=device, dtype=dtype, prefer=prefer,  # type: ignore[arg-type]
                         keep_source=keep_source)

    def problem(self) -> Problem:
        return Problem.of(self.format, self.dims, self.dtype or torch.bfloat16, op=self.op.name)

    def forward(self, x: torch.Tensor) -> ActQuantLoraOutput:
        # QuantModule.forward with this signature (no inputs and options to pack per call):
        # the direct route, else every check.
        kernel = self._direct
        if kernel is not None and not traced(x):
            return kernel(x, self.prepared)  # type: ignore[no-any-return]
        return self._forward_checked((x,), {})  # type: ignore[no-any-return]


class SVDQuantLinear(nn.Module):
    """``y = x Wᵀ + b`` with ``W = lora_up · lora_downᵀ + R``: the residual R stored in
    4-bit codes of the activation format (per output row, blocks along the input), the
    activation quantized by the pre-GEMM kernel. See the module docstring."""

    def __init__(self, act: SVDQuantActQuant, wqout: torch.Tensor, wscales: torch.Tensor,
                 lora_up: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        fmt = act.format
        assert isinstance(fmt, SVDQuantAct)
        k, rank = act.dims["N"], act.dims["R"]
        if wqout.shape[1] * 2 != k or lora_up.shape[1] != rank:
            raise InvalidArgumentError(
                f"SVDQuantLinear: wqout {describe(wqout)} and lora_up {describe(lora_up)} do not fit a "
                f"pre-GEMM of N={k}, R={rank}"
            )
        self.act = act
        self.out_features = lora_up.shape[0]
        self.in_features = k
        self.wqout: torch.Tensor
        self.wscales: torch.Tensor
        self.lora_up: torch.Tensor
        self.bias: torch.Tensor | None
        self.register_buffer("wqout", wqout)
        self.register_buffer("wscales", wscales)
        self.register_buffer("lora_up", lora_up)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, fmt: SVDQuantAct, *, rank: int = 32, dtype: torch.dtype = torch.bfloat16,
        prefer: str | Sequence[str] | None = None,
    ) -> SVDQuantLinear:
        """SVDQuant without calibration (no smoothing): the top-``rank`` SVD of W is the
        LoRA branch, the rest is quantized to 4-bit codes like an activation."""
        w = linear.weight.detach().double()
        # The top right-singular vectors from WᵀW's eigenvectors ([K, K]: cheaper than an SVD
        # of W, and deterministic): lora_down = V_R, lora_up = W V_R = U_R S_R.
        _, vecs = torch.linalg.eigh(w.T @ w)
        rank = min(rank, w.shape[1])
        v = vecs[:, -rank:].flip(-1) if rank else vecs[:, :0]
        lora_down = v.contiguous().to(dtype)  # [K, R]
        lora_up = (w @ v).to(dtype)  # [O, R]
        w = w.float()
        residual = (w - lora_up.float() @ lora_down.float().T).to(dtype)
        codes = fmt.quantize(residual)
        act = SVDQuantActQuant(fmt, {"lora_down": lora_down}, dtype=dtype, prefer=prefer)
        bias = linear.bias.detach().to(dtype) if linear.bias is not None else None
        return cls(act, codes["qout"], codes["oscales"], lora_up, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise KernelInputError(f"x: expected [..., {self.in_features}], got {describe(x)}")
        fmt = self.act.format
        assert isinstance(fmt, SVDQuantAct)
        x2d = x.reshape(-1, self.in_features)
        m = x2d.shape[0]
        qout, oscales, lora_act = self.act(x2d.to(self.lora_up.dtype))
        xq = dequantize_activation(qout, oscales, fp4=fmt.fp4, block=fmt.block)[:m].float()
        w = dequantize_activation(self.wqout, self.wscales, fp4=fmt.fp4, block=fmt.block)[: self.out_features].float()
        y = xq @ w.T + lora_act[:m] @ self.lora_up.float().T
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)
