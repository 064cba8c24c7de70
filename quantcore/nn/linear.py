"""``QuantLinear``: ``y = x Wᵀ + b`` with W in any linear format, as an ordinary module
(its prepared weight in buffers, its calls a ``quantcore::linear`` op when traced; see
:mod:`.quant_module`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..custom_ops import traced
from ..errors import InvalidArgumentError
from ..formats.base import Format
from ..kernels.gated_activation import gated_activation
from ..problem import check_dims
from .quant_module import QuantModule, runs_hooks

__all__ = ["QuantLinear"]


class QuantLinear(QuantModule):
    """A quantized ``nn.Linear``: ``layer(x)`` with x ``[..., in_features]``. Built from a
    checkpoint's tensors, it binds the kernel for ``device`` (default: where the tensors
    are) and activation ``dtype`` at once::

        layer = QuantLinear(GPTQ(bits=4, group_size=128), tensors, device="cuda")

    Built from shapes only, it is a skeleton for ``load_state_dict`` (``assign=True``
    on ``meta``) or for :meth:`load_tensors`::

        layer = QuantLinear(fmt, in_features=4096, out_features=4096, device="meta")
    """

    op_kind = "linear"

    def __init__(
        self,
        fmt: Format,
        tensors: Mapping[str, torch.Tensor] | None = None,
        *,
        in_features: int | None = None,
        out_features: int | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.bfloat16,
        prefer: str | Sequence[str] | None = None,
        keep_source: bool = False,
    ) -> None:
        if tensors is None and (in_features is None or out_features is None):
            raise InvalidArgumentError("QuantLinear: give the checkpoint's tensors, or in_features and out_features")
        if tensors is None:
            check_dims({"in_features": in_features, "out_features": out_features})
        dims = None if tensors is not None else {"K": in_features, "N": out_features}
        super().__init__(fmt, tensors, dims=dims, device=device, dtype=dtype, prefer=prefer,  # type: ignore[arg-type]
                         keep_source=keep_source)

    @property
    def in_features(self) -> int:
        return self.dims["K"]

    @property
    def out_features(self) -> int:
        return self.dims["N"]

    def load_tensors(self, tensors: Mapping[str, torch.Tensor], *, prefer: str | Sequence[str] | None = None) -> None:
        """Bind a checkpoint's tensors for this layer (validated against the format)."""
        self.bind_tensors(tensors, prefer=prefer)

    def gated(self, x: torch.Tensor, activation: str = "silu") -> torch.Tensor:
        """``act(h[..., :I]) · h[..., I:]`` of this layer's output ``h = self(x)``, for a layer
        whose outputs are gate's then up's (a fused gate/up projection, as
        ``ParallelQuantMLP`` and ``quantcore.nn.fuse`` build it): one launch where the kernel
        ends its tiles with the activation (``LinearKernel.gated``), else the layer's call and
        :func:`~quantcore.kernels.gated_activation.gated_activation`'s; the same bits either
        way where the kernel ends the plan of its plain call (a kernel may end another plan
        of the same layer, whose bits are that plan's: ``backends/hopper_wgmma/README.md``,
        "the table's gated plans"). A traced call, a forward hook or a call before the first
        (whose output the module checks) takes the two."""
        kernel = self._direct
        if kernel is not None and not traced(x) and not runs_hooks(self):
            # A linear module's kernels are LinearKernels; said to the type checker only (an
            # isinstance or typing.cast would cost the call a Python frame).
            y = kernel.gated(x, self.prepared, activation)  # type: ignore[attr-defined]
            if y is not None:
                return y
        return gated_activation(self(x), activation)
