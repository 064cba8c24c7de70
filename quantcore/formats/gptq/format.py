"""GPTQ: b-bit integer codes with per-(group, output) scale and zero point.

Stored tensors (a linear with I in-features, O out-features, G = I / group_size groups;
see docs/formats/gptq.md):

=========  ==============  ===============================================
qweight    [I·b/W, O]      pack_dtype lanes of W bits along I: a bit stream,
                           input i in bits [b·i, b·i + b) (formats/packing.py)
qzeros     [G, O·b/W]      the same along O; v2 stores z, v1 stores z − 1
scales     [G, O]          float16 (bf16/fp32 accepted)
g_idx      [I]             int32: group of each input (act-order: not monotonic)
bias       [O]             optional
=========  ==============  ===============================================

b ∈ {2, 3, 4, 8}. For 2/4/8 bits a lane holds W/b whole codes, in any pack dtype
(int8/16/32/64). 3-bit codes do not divide a lane: 32 codes fill 3 int32 lanes and two
of them straddle lanes, so 3-bit GPTQ is int32 only, with I and O multiples of 32.

Dequantization: ``W[o, i] = (q[i, o] − z[g_idx[i], o]) · scales[g_idx[i], o]``.

``desc_act`` (act-order) quantizes columns in a data-dependent order, so ``g_idx`` is a
permutation of group labels. ``static_groups`` computes each group's scale and zero
on the original column order before that permutation: g_idx stays ``i // group_size``
and kernels need no activation permutation (GPTQModel's GPTQ: with static groups the
g_idx of column ``perm[j]`` is ``perm[j] // group_size``, i.e. monotonic once stored).

v1 and a zero of 0 (see :mod:`.convert`): v1 writers store ``z − 1`` per b-bit field,
so z = 0 is the field ``2^b − 1``. This module reads v1 fields as
``(stored + 1) mod 2^b``, which gives 0 back exactly for every bit width (3-bit fields
straddling lanes included).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from ...errors import TensorFormatError
from ..base import Format
from ..grouping import GroupedFormat
from ..packing import LANE_BITS, PackGeometry, unpack_codes

if TYPE_CHECKING:
    from ..sharding import Shard

__all__ = ["GPTQ"]

_CHECKPOINT_ALIASES = {"v1": "v1", "gptq": "v1", "v2": "v2", "gptq_v2": "v2"}


@dataclass(frozen=True)
class GPTQ(GroupedFormat, Format):
    """One GPTQ parameterisation. ``group_size=-1`` means one group over all inputs."""

    name: ClassVar[str] = "gptq"
    version: ClassVar[int] = 1

    bits: int = 4
    group_size: int = 128
    sym: bool = True
    desc_act: bool = False
    checkpoint_format: Literal["v1", "v2"] = "v2"
    pack_dtype: torch.dtype = torch.int32
    static_groups: bool = False

    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = (2, 3, 4, 8)
    shard_dims: ClassVar[tuple[str, ...]] = ("K", "N")
    shard_by_index: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.bits not in self.SUPPORTED_BITS:
            raise TensorFormatError(
                f"gptq bits: expected one of {self.SUPPORTED_BITS}, got {self.bits!r}"
            )
        self._check_group_size()
        fmt = _CHECKPOINT_ALIASES.get(str(self.checkpoint_format))
        if fmt is None:
            raise TensorFormatError(
                f"gptq checkpoint_format: expected v1/gptq or v2/gptq_v2, got {self.checkpoint_format!r}"
            )
        object.__setattr__(self, "checkpoint_format", fmt)
        if self.pack_dtype not in LANE_BITS:
            raise TensorFormatError(f"gptq pack_dtype: expected int8/16/32/64, got {self.pack_dtype}")
        if LANE_BITS[self.pack_dtype] % self.bits and self.pack_dtype != torch.int32:
            raise TensorFormatError(
                f"gptq pack_dtype: {self.bits}-bit codes do not divide a lane, and GPTQ packs them "
                f"only as 32 codes in 3 int32 lanes; expected int32, got {self.pack_dtype}"
            )

    # --- derived quantities -----------------------------------------------------------

    @property
    def slug(self) -> str:
        g = "all" if self.group_size == -1 else str(self.group_size)
        parts = [f"gptq{self.bits}", f"g{g}", "sym" if self.sym else "asym"]
        if self.desc_act:
            parts.append("act")
        if self.static_groups:
            parts.append("static")
        if self.checkpoint_format == "v1":
            parts.append("v1")
        if self.pack_dtype != torch.int32:
            parts.append(str(self.pack_dtype).removeprefix("torch."))
        return "-".join(parts)

    @property
    def geometry(self) -> PackGeometry:
        """How codes tile lanes: ``codes`` per ``lanes`` (8 per 1 at 4 bits, 32 per 3 at 3)."""
        return PackGeometry(self.bits, self.pack_dtype)

    @property
    def pack_factor(self) -> int:
        """Codes per lane; only defined when the bit width divides the lane."""
        geo = self.geometry
        if geo.lanes != 1:
            raise TensorFormatError(f"{self.slug}: {self.bits}-bit codes have no whole pack factor")
        return geo.codes

    @property
    def maxq(self) -> int:
        return (1 << self.bits) - 1

    @property
    def uses_act_order(self) -> bool:
        """True when g_idx may be non-monotonic (act-order without static groups)."""
        return self.desc_act and not self.static_groups

    def in_features_of(self, qweight: torch.Tensor) -> int:
        geo = self.geometry
        rows = qweight.shape[0]
        if rows % geo.lanes:
            raise TensorFormatError(
                f"{self.slug}: qweight: {rows} rows is not a multiple of {geo.lanes} "
                f"({self.bits}-bit codes fill {geo.lanes} lanes per {geo.codes} inputs)"
            )
        return rows // geo.lanes * geo.codes

    # --- validation ---------------------------------------------------------------------

    def validate(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
        from .validate import validate_gptq

        return validate_gptq(self, tensors)

    def shard_rules(self, dim: str) -> tuple[str, ...]:
        """Act-order row cuts: ``"replicate"`` (the default, vLLM's) or ``"groups"`` (see .shard)."""
        if dim == "K" and self.uses_act_order and self.group_size != -1:
            return ("replicate", "groups")
        return ()

    def shard_tensors(
        self, tensors: Mapping[str, torch.Tensor], *, dim: str, rank: int, world: int, **extra: Any
    ) -> Shard:
        from .shard import shard_gptq

        rule = extra.get("rule")
        return shard_gptq(self, tensors, dim=dim, rank=rank, world=world,
                          rule=None if rule == "replicate" else rule, index=extra.get("index"))

    concatenates: ClassVar[bool] = True

    def concat_tensors(
        self, parts: Sequence[Mapping[str, torch.Tensor]], *, names: Sequence[str] | None = None
    ) -> dict[str, torch.Tensor]:
        from .shard import concat_gptq

        return concat_gptq(self, parts, names=names)

    # --- unpacking, shared by the dequantizer and by kernels' transforms -----------------

    def unpack_weight(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Codes ``[I, O]`` int32 in ``[0, 2^bits)``."""
        return unpack_codes(tensors["qweight"], self.bits, dim=0)

    def unpack_zeros(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """True integer zero points ``[G, O]`` int32 (v1's −1 offset undone, wrapped)."""
        from .convert import stored_to_zero

        return stored_to_zero(unpack_codes(tensors["qzeros"], self.bits, dim=1), self)

    def group_index(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``g_idx`` as int64; the trivial ``i // group_size`` when the checkpoint has none."""
        g_idx = tensors.get("g_idx")
        if g_idx is not None:
            return g_idx.to(torch.int64)
        in_features = self.in_features_of(tensors["qweight"])
        gs = self.effective_group_size(in_features)
        return torch.arange(in_features, device=tensors["qweight"].device) // gs

    # --- golden math ------------------------------------------------------------------------

    def dequantize(
        self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """Dense ``W [O, I]`` (nn.Linear layout) in ``dtype``."""
        self.validate(tensors)
        w = self.unpack_weight(tensors).to(dtype)  # q, [I, O]
        z = self.unpack_zeros(tensors).to(dtype)  # [G, O]
        s = tensors["scales"].to(dtype)  # [G, O]
        g = self.group_index(tensors)
        w -= z[g]  # (q - z) * s, in place: the same rounding, one [I, O] buffer fewer
        w *= s[g]
        return w.T.contiguous()

    def quantize(
        self,
        weight: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        perm: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        from .quantize import quantize_rtn

        return quantize_rtn(self, weight, generator=generator, perm=perm)
