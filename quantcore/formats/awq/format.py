"""AWQ, GEMM layout: 4-bit codes packed along the *output* dim, in AWQ's nibble order.

Stored tensors (AutoAWQ ``WQLinear_GEMM``; I in-features, O out-features,
G = I / group_size):

=========  ===========  ==================================================
qweight    [I, O/8]     int32; row i holds input i of 8 outputs per lane,
                        nibble p = output ``AWQ_ORDER[p]`` of the lane
qzeros     [G, O/8]     int32, the same packing: integer zero points
scales     [G, O]       float16 (bf16/fp32 accepted)
bias       [O]          optional
=========  ===========  ==================================================

Dequantization: ``W[o, i] = (q[i, o] − z[i // group_size, o]) · scales[i // group_size, o]``.
No g_idx, no act-order. ``layout`` is what AutoAWQ and Hugging Face configs call
``version`` (only "gemm" is this layout; "gemv"/"gemv_fast" pack differently). ``zero_point=False`` (AutoAWQ's symmetric mode, codes in
[−8, 7]) is stored the only way this layout can hold it: codes + 8 with every zero
point 8.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ...errors import TensorFormatError
from ...tensors import describe, reject_unknown, require_tensor, require_tensors
from ..base import Format
from ..grouping import SCALE_DTYPES, GroupedFormat, check_linear_extras
from .order import unpack_awq

if TYPE_CHECKING:
    from ..sharding import Shard

__all__ = ["AWQ"]

TENSOR_NAMES = ("qweight", "qzeros", "scales", "bias")
VERSIONS = ("gemm",)


@dataclass(frozen=True)
class AWQ(GroupedFormat, Format):
    name: ClassVar[str] = "awq"
    version: ClassVar[int] = 1

    bits: int = 4
    group_size: int = 128
    zero_point: bool = True
    layout: str = "gemm"

    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = (4,)
    shard_dims: ClassVar[tuple[str, ...]] = ("K", "N")

    def __post_init__(self) -> None:
        if self.bits not in self.SUPPORTED_BITS:
            raise TensorFormatError(f"awq bits: expected one of {self.SUPPORTED_BITS} (GEMM layout), got {self.bits!r}")
        self._check_group_size()
        layout = str(self.layout).lower()
        if layout not in VERSIONS:
            raise TensorFormatError(f"awq layout (AutoAWQ's version): expected one of {VERSIONS}, got {self.layout!r}")
        object.__setattr__(self, "layout", layout)

    @property
    def slug(self) -> str:
        g = "all" if self.group_size == -1 else str(self.group_size)
        return f"awq{self.bits}-g{g}" + ("" if self.zero_point else "-nozp")

    @property
    def maxq(self) -> int:
        return (1 << self.bits) - 1

    def validate(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
        where = f"{self.slug} tensors"
        reject_unknown(tensors, TENSOR_NAMES, where=where, takes=f"awq takes {', '.join(TENSOR_NAMES)} (bias optional)")
        require_tensors(tensors, ("qweight", "qzeros", "scales"), where=where)
        qweight = require_tensor("qweight", tensors["qweight"], dtypes=(torch.int32,), where=where)
        if qweight.dim() != 2 or qweight.numel() == 0:
            raise TensorFormatError(f"{where}: qweight: expected non-empty 2-D [I, O/8] int32, got {describe(qweight)}")
        in_features, out_features = qweight.shape[0], qweight.shape[1] * 8
        groups = self.num_groups(in_features)
        require_tensor("scales", tensors["scales"], shape=(groups, out_features), dtypes=SCALE_DTYPES, where=where)
        require_tensor("qzeros", tensors["qzeros"], shape=(groups, out_features // 8), dtypes=(torch.int32,), where=where)
        check_linear_extras(tensors, out_features, where)
        return {"K": in_features, "N": out_features}

    def shard_tensors(
        self, tensors: Mapping[str, torch.Tensor], *, dim: str, rank: int, world: int, **extra: Any
    ) -> Shard:
        from .shard import shard_awq

        return shard_awq(self, tensors, dim=dim, rank=rank, world=world)

    concatenates: ClassVar[bool] = True

    def concat_tensors(
        self, parts: Sequence[Mapping[str, torch.Tensor]], *, names: Sequence[str] | None = None
    ) -> dict[str, torch.Tensor]:
        from .shard import concat_awq

        return concat_awq(self, parts, names=names)

    def unpack_weight(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Codes ``[I, O]`` int32, columns in natural order."""
        return unpack_awq(tensors["qweight"])

    def unpack_zeros(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Integer zero points ``[G, O]`` int32."""
        return unpack_awq(tensors["qzeros"])

    def dequantize(self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float64) -> torch.Tensor:
        dims = self.validate(tensors)
        g = torch.arange(dims["K"], device=tensors["qweight"].device) // self.effective_group_size(dims["K"])
        q = self.unpack_weight(tensors).to(dtype)
        z = self.unpack_zeros(tensors).to(dtype)
        s = tensors["scales"].to(dtype)
        return ((q - z[g]) * s[g]).T.contiguous()

    def quantize(self, weight: torch.Tensor, *, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        from .quantize import quantize_awq

        return quantize_awq(self, weight)
