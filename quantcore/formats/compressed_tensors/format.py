"""compressed-tensors ``pack-quantized``, integer weights (docs/checkpoints.md).

Stored tensors of one linear (O out-features, I in-features, G groups; b-bit codes):

==================  ============  ================================================
weight_packed       [O, I·b/32]   int32; row o is a little-endian bit stream of the
                                  codes of inputs 0..I−1 (input i in bits [b·i, b·i+b))
weight_scale        [O, G]        float16 / bfloat16 / float32
weight_zero_point   [O·b/32, G]   int32, asymmetric only: zero points packed the same
                                  way along the *output* dim
weight_shape        [2]           int32 / int64: (O, I)
weight_g_idx        [I]           int32, act-order only: the group of each input
bias                [O]           optional
==================  ============  ================================================

Codes and zero points are signed, ``q ∈ [−2^(b−1), 2^(b−1))``, and stored offset by
``2^(b−1)`` so the fields are unsigned. Dequantization:
``W[o, i] = (q[o, i] − z[o, g(i)]) · weight_scale[o, g(i)]`` with z = 0 when symmetric
and ``g(i) = weight_g_idx[i]`` (``i // group_size`` without act-order). In the stored
(offset) fields that is GPTQ's rule with the zero point ``z + 2^(b−1)``, which is why
every GPTQ kernel can run it (:mod:`quantcore.transforms.compressed_gptq`).

Only 2, 4 and 8 bits: their fields never straddle a lane, so the layout is the same in
every compressed-tensors release (3, 5, 6 and 7-bit packing changed between releases).
``group_size=-1`` is the ``channel`` strategy (one group, ``weight_scale [O, 1]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import TensorFormatError
from ...tensors import describe, reject_unknown, require_tensor, require_tensors
from ..base import Format
from ..grouping import SCALE_DTYPES, GroupedFormat
from ..packing import unpack_codes

__all__ = ["TENSOR_NAMES", "CompressedTensors"]

TENSOR_NAMES = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx", "bias")
SHAPE_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class CompressedTensors(GroupedFormat, Format):
    """One pack-quantized integer weight scheme. ``act_order``: the layer stores
    ``weight_g_idx`` (compressed-tensors' ``actorder: "group"``)."""

    name: ClassVar[str] = "compressed_tensors"
    version: ClassVar[int] = 1

    bits: int = 4
    group_size: int = 128
    sym: bool = True
    act_order: bool = False

    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = (2, 4, 8)

    def __post_init__(self) -> None:
        if self.bits not in self.SUPPORTED_BITS:
            raise TensorFormatError(
                f"compressed_tensors bits: expected one of {self.SUPPORTED_BITS} (pack-quantized fields "
                f"that never straddle an int32), got {self.bits!r}"
            )
        self._check_group_size()
        if self.act_order and self.group_size == -1:
            raise TensorFormatError("compressed_tensors act_order: needs groups (group_size > 0); the channel "
                                    "strategy has one group, so there is nothing to reorder")

    @property
    def slug(self) -> str:
        g = "all" if self.group_size == -1 else str(self.group_size)
        parts = [f"ct{self.bits}", f"g{g}", "sym" if self.sym else "asym"]
        if self.act_order:
            parts.append("act")
        return "-".join(parts)

    @property
    def per_lane(self) -> int:
        return 32 // self.bits

    @property
    def offset(self) -> int:
        """What the stored fields add to the signed codes and zero points: ``2^(b−1)``."""
        return 1 << (self.bits - 1)

    # --- validation ---------------------------------------------------------------------

    def validate(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
        where = f"{self.slug} tensors"
        reject_unknown(tensors, TENSOR_NAMES, where=where,
                       takes=f"pack-quantized takes {', '.join(TENSOR_NAMES)}")
        needed = ["weight_packed", "weight_scale", "weight_shape"]
        needed += [] if self.sym else ["weight_zero_point"]
        needed += ["weight_g_idx"] if self.act_order else []
        require_tensors(tensors, needed, where=where)
        shape = require_tensor("weight_shape", tensors["weight_shape"], shape=(2,), dtypes=SHAPE_DTYPES, where=where)
        out_features, in_features = (int(v) for v in shape.tolist())
        if out_features <= 0 or in_features <= 0:
            raise TensorFormatError(f"{where}: weight_shape: expected (out_features, in_features) > 0, got "
                                    f"{(out_features, in_features)}")
        for dim, n in (("in_features", in_features), ("out_features", out_features)):
            if n % self.per_lane:
                raise TensorFormatError(
                    f"{where}: weight_shape: {dim}={n} is not a multiple of {self.per_lane}; a {self.bits}-bit "
                    f"layer is read in whole int32 lanes of {self.per_lane} codes"
                )
        groups = self.num_groups(in_features)
        require_tensor("weight_packed", tensors["weight_packed"], shape=(out_features, in_features // self.per_lane),
                       dtypes=(torch.int32,), where=where)
        scale = require_tensor("weight_scale", tensors["weight_scale"], shape=(out_features, groups),
                               dtypes=SCALE_DTYPES, where=where)
        if not torch.isfinite(scale).all():
            raise TensorFormatError(f"{where}: weight_scale: contains NaN or Inf")
        if "weight_zero_point" in tensors:
            if self.sym:
                raise TensorFormatError(f"{where}: weight_zero_point: a symmetric scheme stores no zero points, "
                                        f"got {describe(tensors['weight_zero_point'])}")
            require_tensor("weight_zero_point", tensors["weight_zero_point"],
                           shape=(out_features // self.per_lane, groups), dtypes=(torch.int32,), where=where)
        if "weight_g_idx" in tensors:
            self._check_g_idx(tensors["weight_g_idx"], in_features, groups, where)
        bias = tensors.get("bias")
        if bias is not None:
            require_tensor("bias", bias, shape=(out_features,), dtypes=SCALE_DTYPES, where=where)
        return {"K": in_features, "N": out_features}

    def _check_g_idx(self, g_idx: torch.Tensor, in_features: int, groups: int, where: str) -> None:
        require_tensor("weight_g_idx", g_idx, shape=(in_features,), dtypes=(torch.int32, torch.int64), where=where)
        lo, hi = int(g_idx.min()), int(g_idx.max())
        if lo < 0 or hi >= groups:
            raise TensorFormatError(f"{where}: weight_g_idx: expected groups in [0, {groups}), got range [{lo}, {hi}]")
        if not self.act_order:
            gs = self.effective_group_size(in_features)
            if not torch.equal(g_idx.long(), torch.arange(in_features, device=g_idx.device) // gs):
                raise TensorFormatError(f"{where}: weight_g_idx: the scheme has no act-order (actorder is not "
                                        f"'group'), but the groups are not i // {gs}")

    # --- reading the fields --------------------------------------------------------------

    def unpack_weight(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The stored (offset) codes ``[O, I]`` int32 in ``[0, 2^b)``."""
        return unpack_codes(tensors["weight_packed"], self.bits, dim=1)

    def unpack_zeros(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The stored (offset) zero points ``[O, G]`` int32; ``2^(b−1)`` everywhere when symmetric."""
        if self.sym:
            scale = tensors["weight_scale"]
            return torch.full(scale.shape, self.offset, dtype=torch.int32, device=scale.device)
        return unpack_codes(tensors["weight_zero_point"], self.bits, dim=0)

    def group_index(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The group of each input, int64 ``[I]``."""
        g_idx = tensors.get("weight_g_idx")
        if g_idx is not None:
            return g_idx.long()
        in_features = int(tensors["weight_shape"][1])
        gs = self.effective_group_size(in_features)
        return torch.arange(in_features, device=tensors["weight_packed"].device) // gs

    # --- golden math ------------------------------------------------------------------------

    def dequantize(self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Dense ``W [O, I]`` in ``dtype``."""
        self.validate(tensors)
        g = self.group_index(tensors)
        w = self.unpack_weight(tensors).to(dtype)
        w -= self.unpack_zeros(tensors).to(dtype)[:, g]
        w *= tensors["weight_scale"].to(dtype)[:, g]
        return w

    def quantize(
        self, weight: torch.Tensor, *, generator: torch.Generator | None = None, perm: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        from .quantize import quantize_minmax

        return quantize_minmax(self, weight, generator=generator, perm=perm)
