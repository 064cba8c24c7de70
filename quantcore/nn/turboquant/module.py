"""``TurboQuantLinear``: an ``nn.Linear`` replacement for TurboQuant weights, a
:class:`~quantcore.nn.quant_module.QuantModule` like :class:`~quantcore.nn.linear.QuantLinear`:
bound once down the kernel ranking (with the fallback past a kernel that fails on the
weight), its prepared state in buffers, its calls a ``quantcore::linear`` op when
traced.

The format's tensors (``indices``, ``norms``, ``rotation`` per pass, ``codebook``,
``bias``) come back from the prepared state with :meth:`TurboQuantLinear.tensors`
(the pass transform's inverse; exact where the rotations were prepared in float32 — on
the CPU — and from the kept source otherwise). With ``cpu_offload_pass2`` the residual
pass's buffers stay in (pinned) host memory and reach the GPU through a
:class:`Pass2OffloadPool`; that path runs eagerly (side streams, events).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ...custom_ops import traced
from ...errors import KernelInputError, TensorFormatError
from ...formats.turboquant.format import TurboQuant
from ...kernels.turboquant import TurboQuantLinearKernel, TurboQuantPrepared
from ...problem import check_dims
from ...transforms.turboquant_passes import TurboQuantPassTransform
from ..quant_module import QuantModule
from .offload import OffloadedPass, Pass2OffloadPool

__all__ = ["TurboQuantLinear"]


class TurboQuantLinear(QuantModule):
    """``y = x Ŵᵀ + b`` with Ŵ stored in a :class:`TurboQuant` format. ``dtype`` is the
    activation dtype the kernel is prepared for (None: float32, every kernel's CPU choice)."""

    op_kind = "linear"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        fmt: TurboQuant,
        *,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        keep_source: bool = False,
    ) -> None:
        check_dims({"in_features": in_features, "out_features": out_features})
        if in_features % fmt.group_size:
            raise KernelInputError(
                f"in_features={in_features} is not a multiple of group_size={fmt.group_size}"
            )
        super().__init__(fmt, dims={"K": in_features, "N": out_features}, device=device, dtype=dtype,
                         keep_source=keep_source)
        self.has_bias = bias
        self.cpu_offload_pass2 = False
        self._pool: Pass2OffloadPool | None = None
        self._pass2_names: tuple[str, ...] = ()
        self._offloaded: OffloadedPass | None = None

    @property
    def fmt(self) -> TurboQuant:
        return self.format  # type: ignore[return-value]

    @property
    def in_features(self) -> int:
        return self.dims["K"]

    @property
    def out_features(self) -> int:
        return self.dims["N"]

    # --- construction -----------------------------------------------------------------------

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        fmt: TurboQuant,
        *,
        generator: torch.Generator | None = None,
        dtype: torch.dtype | None = None,
        keep_source: bool = False,
        prefer: str | Sequence[str] | None = None,
    ) -> TurboQuantLinear:
        """Quantize ``linear`` with the golden quantizer, on the linear's device; ``prefer``
        names kernels to try first, as for ``get_kernel``."""
        weight = linear.weight.detach()
        module = cls(linear.in_features, linear.out_features, fmt, bias=linear.bias is not None,
                     device=weight.device, dtype=dtype, keep_source=keep_source)
        tensors = fmt.quantize(weight, generator=generator)
        if linear.bias is not None:
            tensors["bias"] = linear.bias.detach().to(torch.float32)
        module.load_tensors(tensors, prefer=prefer)
        return module

    def load_tensors(self, tensors: Mapping[str, torch.Tensor], *, prefer: str | Sequence[str] | None = None) -> None:
        """Take a checkpoint's tensors (validated against the format) and prepare them
        (``prefer``: kernels to try first)."""
        if ("bias" in tensors) != self.has_bias:
            raise KernelInputError(
                "tensors carry a bias; the module was built with bias=False" if self.has_bias is False
                else "tensors carry no bias; the module was built with bias=True"
            )
        self.bind_tensors(tensors, prefer=prefer)
        if self.cpu_offload_pass2:
            self._offload_buffers()

    def tensors(self) -> dict[str, torch.Tensor]:
        """The format's tensors (and bias): the kept source, or the prepared passes inverted."""
        source = self._source()
        if source:
            return source
        prepared = self.prepared
        if not isinstance(prepared, TurboQuantPrepared):
            stored = self.kernel.stored_tensors(prepared) if self.kernel is not None else None
            if stored is not None:
                return stored
            raise TensorFormatError(
                f"{self.fmt.slug}: {getattr(self.kernel, 'name', None)} holds a dequantized weight; the format's "
                "tensors are gone (build the module with keep_source=True to keep them)"
            )
        out: dict[str, torch.Tensor] = {}
        inverse = TurboQuantPassTransform(self.fmt, split_halves=prepared.split_halves)
        for prefix, data in zip(self.fmt.passes, prepared.passes, strict=True):
            if data.rotation.dtype != torch.float32:
                raise TensorFormatError(
                    f"{self.fmt.slug}: the rotations were prepared in {data.rotation.dtype} for the kernel, so the "
                    "stored float32 ones cannot be rebuilt exactly; quantize or load with keep_source=True to save "
                    "from this module (or save from one prepared on the CPU)"
                )
            out.update({prefix + name: t for name, t in inverse.invert(data).items()})
        out["codebook"] = prepared.codebook[: self.fmt.levels].clone()
        if prepared.bias is not None:
            out["bias"] = prepared.bias
        return out

    # --- offload ---------------------------------------------------------------------------

    def offload_pass2(self, pool: Pass2OffloadPool) -> None:
        """Keep the residual pass in host memory; stream it in through ``pool``."""
        if not self.fmt.residual:
            raise KernelInputError(f"{self.fmt.slug} has no residual pass to offload")
        self.cpu_offload_pass2 = True
        self._pool = pool
        if self.has_weight:
            self._offload_buffers()

    def _offload_buffers(self) -> None:
        prepared = self.prepared
        if not isinstance(prepared, TurboQuantPrepared) or not isinstance(self.kernel, TurboQuantLinearKernel):
            self._pass2_names = ()  # a kernel outside the pass contract runs the whole weight resident
            return
        ids = {id(t) for t in prepared.passes[1].tensors().values()}
        self._pass2_names = tuple(n for n, t in zip(self._names, self.state_tensors(), strict=True) if id(t) in ids)
        for name in self._pass2_names:
            # Host memory only: OffloadedPass packs the pass into one pinned buffer (one copy a layer).
            self._buffers[name] = self._buffers[name].detach().to("cpu")  # type: ignore[union-attr]
        self._rebuild()
        self._offloaded = None

    def _stays(self, name: str) -> bool:
        return name in self._pass2_names

    def _moved_to(self, device: torch.device) -> None:
        super()._moved_to(device)
        self._offloaded = None

    def _offloaded_pass(self, device: torch.device) -> OffloadedPass:
        if self._offloaded is None:
            assert self._pool is not None
            self._offloaded = OffloadedPass(self.prepared.passes[1], name=f"{type(self).__name__}@{id(self):x}")
            self._pool.register(self._offloaded, device)
        return self._offloaded

    # --- forward ---------------------------------------------------------------------------

    def _forward_checked(self, inputs: tuple[Any, ...], options: dict[str, Any]) -> Any:
        # An offloaded module never takes the direct route: offloading rebuilds the state
        # (which clears it) and its calls come here, never to the base class that sets it.
        if not self._pass2_names or not inputs:
            return super()._forward_checked(inputs, options)
        if traced(inputs[0]):
            raise KernelInputError(
                "cpu_offload_pass2 streams pass 2 on a side stream and runs eagerly; compile or export the model "
                "without it"
            )
        return self._forward_offloaded(*inputs, **options)

    def _forward_offloaded(self, x: torch.Tensor) -> torch.Tensor:
        kernel, prepared = self.kernel, self.prepared
        assert isinstance(kernel, TurboQuantLinearKernel) and isinstance(prepared, TurboQuantPrepared)
        assert self._pool is not None
        if self._blocked is not None:
            raise KernelInputError(self._blocked)
        kernel.check_input(x, prepared)
        entry = self._offloaded_pass(x.device)
        x2d = x.reshape(-1, self.in_features)
        slot = self._pool.begin(entry)  # fence + prefetch of the next layer
        data = self._pool.wait(slot, entry)  # this layer's copy, issued one layer earlier
        y = kernel.run_passes(x2d, (prepared.passes[0], data), prepared, bias=prepared.bias, out_dtype=x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        offload = ", cpu_offload_pass2=True" if self.cpu_offload_pass2 else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.fmt.slug}{offload}"

