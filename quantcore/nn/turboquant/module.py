"""``TurboQuantLinear``: an ``nn.Linear`` replacement that stores TurboQuant tensors and
runs them through whichever kernel :func:`quantcore.bind` picks for the device — with
``bind``'s fallback to the next candidate when a kernel fails on the weight or in a call.

The module holds the format's tensors as buffers (so ``state_dict`` is the checkpoint)
and, per (device, activation dtype), the bound kernel and its prepared state, rebuilt
whenever the module moves. With ``cpu_offload_pass2`` the residual pass's buffers stay
in (pinned) host memory and reach the GPU through a :class:`Pass2OffloadPool`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ...binding import BoundKernel, bind
from ...errors import KernelInputError
from ...formats.turboquant.format import PASS_TENSORS, RESIDUAL_PREFIX, TurboQuant
from ...problem import Problem
from ...tensors import describe
from .kernel import TurboQuantLinearKernel, TurboQuantPrepared, pass_tensors
from .offload import OffloadedPass, Pass2OffloadPool, pin

__all__ = ["TurboQuantLinear"]


@dataclasses.dataclass
class _Runner:
    bound: BoundKernel
    #: Pass 2 streamed from host memory; the bound kernel then runs pass 1 only.
    offloaded: OffloadedPass | None = None


class TurboQuantLinear(nn.Module):
    """``y = x Ŵᵀ + b`` with Ŵ stored in a :class:`TurboQuant` format."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        fmt: TurboQuant,
        *,
        bias: bool = True,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if in_features % fmt.group_size:
            raise KernelInputError(
                f"in_features={in_features} is not a multiple of group_size={fmt.group_size}"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.fmt = fmt
        groups = in_features // fmt.group_size
        d = fmt.group_size
        for prefix in fmt.passes:
            self.register_buffer(prefix + "indices", torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device))
            self.register_buffer(prefix + "norms", torch.zeros(out_features, groups, dtype=fmt.norm_dtype, device=device))
            rotation = torch.eye(d, device=device).expand(fmt.num_rotations(in_features), d, d).contiguous()
            self.register_buffer(prefix + "rotation", rotation)
        self.register_buffer("codebook", torch.zeros(fmt.levels, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=torch.float32, device=device) if bias else None)
        self.cpu_offload_pass2 = False
        self._pool: Pass2OffloadPool | None = None
        self._runners: dict[tuple[str, torch.dtype], _Runner] = {}

    # --- construction -----------------------------------------------------------------------

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, fmt: TurboQuant, *, generator: torch.Generator | None = None
    ) -> TurboQuantLinear:
        weight = linear.weight.detach()
        module = cls(linear.in_features, linear.out_features, fmt, bias=linear.bias is not None, device=weight.device)
        tensors = fmt.quantize(weight, generator=generator)
        if linear.bias is not None:
            tensors["bias"] = linear.bias.detach().to(torch.float32)
        module.load_tensors(tensors)
        return module

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Take a checkpoint's tensors (validated against the format)."""
        dims = self.fmt.validate(tensors)
        if (dims["K"], dims["N"]) != (self.in_features, self.out_features):
            raise KernelInputError(
                f"tensors describe a {dims['K']} → {dims['N']} linear, the module is "
                f"{self.in_features} → {self.out_features}"
            )
        for name, t in tensors.items():
            if name == "bias" and self.bias is None:
                raise KernelInputError("tensors carry a bias; the module was built with bias=False")
            current = getattr(self, name)
            setattr(self, name, t.detach().to(current.device, current.dtype if name == "bias" else t.dtype).clone())
        self._runners.clear()

    def tensors(self) -> dict[str, torch.Tensor]:
        """The format's tensors (and bias) as stored in this module."""
        names = [p + t for p in self.fmt.passes for t in PASS_TENSORS] + ["codebook"]
        out = {name: getattr(self, name) for name in names}
        if self.bias is not None:
            out["bias"] = self.bias
        return out

    # --- offload ---------------------------------------------------------------------------

    def offload_pass2(self, pool: Pass2OffloadPool) -> None:
        """Keep the residual pass in host memory; stream it in through ``pool``."""
        if not self.fmt.residual:
            raise KernelInputError(f"{self.fmt.slug} has no residual pass to offload")
        self.cpu_offload_pass2 = True
        self._pool = pool
        for name in self._pass2_names():
            self._buffers[name] = pin(self._buffers[name])  # type: ignore[arg-type]
        self._runners.clear()

    def _pass2_names(self) -> list[str]:
        return [RESIDUAL_PREFIX + t for t in PASS_TENSORS]

    def _apply(self, fn: Any, recurse: bool = True) -> TurboQuantLinear:
        held = {}
        if self.cpu_offload_pass2:
            held = {name: self._buffers.pop(name) for name in self._pass2_names()}
        try:
            super()._apply(fn, recurse)
        finally:
            self._buffers.update(held)
        self._runners.clear()
        return self

    # --- forward ---------------------------------------------------------------------------

    def _runner(self, x: torch.Tensor) -> _Runner:
        key = (str(x.device), x.dtype)
        runner = self._runners.get(key)
        if runner is not None:
            return runner
        runner = self._offloaded_runner(x) if self.cpu_offload_pass2 else None
        if runner is None:
            problem = Problem.linear(self.fmt, K=self.in_features, N=self.out_features, dtype=x.dtype)
            runner = _Runner(bind(self.fmt, x.device, self.tensors(), problem=problem, dtype=x.dtype))
        self._runners[key] = runner
        return runner

    def _offloaded_runner(self, x: torch.Tensor) -> _Runner | None:
        """Pass 1 bound as a format of its own, pass 2 prepared on the host for the same
        kernel; None when the chosen kernel is outside the pass-level contract (the
        dequantizing fallback), which then runs the whole weight."""
        pass1_fmt = dataclasses.replace(self.fmt, residual=False)
        resident = {k: v for k, v in self.tensors().items() if not k.startswith(RESIDUAL_PREFIX)}
        problem = Problem.linear(pass1_fmt, K=self.in_features, N=self.out_features, dtype=x.dtype)
        bound = bind(pass1_fmt, x.device, resident, problem=problem, dtype=x.dtype)
        pass1 = bound.kernel
        if not isinstance(pass1, TurboQuantLinearKernel):
            return None
        host = pass1.prepare_pass(  # packed into one pinned buffer by OffloadedPass
            pass_tensors(self.tensors(), RESIDUAL_PREFIX), dtype=pass1.compute_dtype(x.dtype)
        )
        assert self._pool is not None
        entry = OffloadedPass(host, name=f"{type(self).__name__}@{id(self):x}")
        self._pool.register(entry, x.device)
        return _Runner(bound, entry)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise KernelInputError(f"x: expected [..., {self.in_features}], got {describe(x)}")
        runner = self._runner(x)
        if runner.offloaded is None:
            return runner.bound(x)  # type: ignore[no-any-return]
        return self._forward_offloaded(x, runner)

    def _forward_offloaded(self, x: torch.Tensor, runner: _Runner) -> torch.Tensor:
        kernel, prepared, entry = runner.bound.kernel, runner.bound.prepared, runner.offloaded
        assert isinstance(kernel, TurboQuantLinearKernel) and isinstance(prepared, TurboQuantPrepared)
        assert self._pool is not None and entry is not None
        kernel.check_input(x, prepared)
        x2d = x.reshape(-1, self.in_features)
        slot = self._pool.begin(entry)  # fence + prefetch of the next layer
        data = self._pool.wait(slot, entry)  # this layer's copy, issued one layer earlier
        y = kernel.run_passes(x2d, (prepared.passes[0], data), prepared, bias=prepared.bias, out_dtype=x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        offload = ", cpu_offload_pass2=True" if self.cpu_offload_pass2 else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.fmt.slug}{offload}"
