"""GPTQ: b-bit integer codes with per-(group, output) scale and zero point.

Stored tensors (a linear with I in-features, O out-features, G groups, ``pf`` codes per
lane; see seeds/gptq-storage-format.md):

=========  ============  =================================================
qweight    [I/pf, O]     pack_dtype lanes; lane r of column o holds inputs
                         r·pf … r·pf+pf−1, the lowest input in the lowest bits
qzeros     [G, O/pf]     pack_dtype lanes along O; v2 stores z, v1 stores z − 1
scales     [G, O]        float16 (bf16/fp32 accepted)
g_idx      [I]           int32: group of each input (act-order: not monotonic)
bias       [O]           optional
=========  ============  =================================================

Dequantization: ``W[o, i] = (q[i, o] − z[g_idx[i], o]) · scales[g_idx[i], o]``.

v1 and a zero of 0: v1 writers store ``(z − 1)`` in b bits, so z = 0 is stored as
``2^b − 1`` (−1 wrapped). This module reads v1 zeros as ``(stored + 1) mod 2^b``, which
gives 0 back; readers that add 1 without wrapping get ``2^b``, an out-of-range zero —
the "bug in common implementations" the seed describes. Writers that cast −1 to
uint32 before shifting also smear ones into the neighbouring lanes; this packer masks
each code to b bits, so a v1 checkpoint written here round-trips exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from ...errors import TensorFormatError
from ...tensors import describe, reject_unknown, require_tensor, require_tensors
from ..base import Format
from ..packing import LANE_BITS, unpack_codes

__all__ = ["GPTQ"]

_SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_CHECKPOINT_ALIASES = {"v1": "v1", "gptq": "v1", "v2": "v2", "gptq_v2": "v2"}
TENSOR_NAMES = ("qweight", "qzeros", "scales", "g_idx", "bias")


@dataclass(frozen=True)
class GPTQ(Format):
    """One GPTQ parameterisation. ``group_size=-1`` means one group over all inputs."""

    name: ClassVar[str] = "gptq"
    version: ClassVar[int] = 1

    bits: int = 4
    group_size: int = 128
    sym: bool = True
    desc_act: bool = False
    checkpoint_format: Literal["v1", "v2"] = "v2"
    pack_dtype: torch.dtype = torch.int32

    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = (2, 4, 8)

    def __post_init__(self) -> None:
        if self.bits not in self.SUPPORTED_BITS:
            raise TensorFormatError(
                f"gptq bits: expected one of {self.SUPPORTED_BITS}, got {self.bits!r}"
            )
        if not (self.group_size == -1 or (isinstance(self.group_size, int) and self.group_size > 0)):
            raise TensorFormatError(
                f"gptq group_size: expected a positive int or -1, got {self.group_size!r}"
            )
        fmt = _CHECKPOINT_ALIASES.get(str(self.checkpoint_format))
        if fmt is None:
            raise TensorFormatError(
                f"gptq checkpoint_format: expected v1/gptq or v2/gptq_v2, got {self.checkpoint_format!r}"
            )
        object.__setattr__(self, "checkpoint_format", fmt)
        if self.pack_dtype not in LANE_BITS or LANE_BITS[self.pack_dtype] % self.bits:
            raise TensorFormatError(
                f"gptq pack_dtype: expected int8/16/32/64 holding whole {self.bits}-bit codes, "
                f"got {self.pack_dtype}"
            )

    # --- derived quantities -----------------------------------------------------------

    @property
    def slug(self) -> str:
        g = "all" if self.group_size == -1 else str(self.group_size)
        parts = [f"gptq{self.bits}", f"g{g}", "sym" if self.sym else "asym"]
        if self.desc_act:
            parts.append("act")
        if self.checkpoint_format == "v1":
            parts.append("v1")
        if self.pack_dtype != torch.int32:
            parts.append(str(self.pack_dtype).removeprefix("torch."))
        return "-".join(parts)

    @property
    def pack_factor(self) -> int:
        return LANE_BITS[self.pack_dtype] // self.bits

    @property
    def maxq(self) -> int:
        return (1 << self.bits) - 1

    def effective_group_size(self, in_features: int) -> int:
        return in_features if self.group_size == -1 else self.group_size

    def num_groups(self, in_features: int) -> int:
        gs = self.effective_group_size(in_features)
        return -(-in_features // gs)

    @classmethod
    def from_params(cls, **params: Any) -> GPTQ:
        p = dict(params)
        if isinstance(p.get("pack_dtype"), str):
            p["pack_dtype"] = getattr(torch, p["pack_dtype"].removeprefix("torch."))
        for key in ("sym", "desc_act"):
            if isinstance(p.get(key), str):
                p[key] = p[key].lower() in ("1", "true", "yes")
        for key in ("bits", "group_size"):
            if isinstance(p.get(key), str):
                p[key] = int(p[key])
        return cls(**p)

    # --- validation ---------------------------------------------------------------------

    def validate(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
        where = f"{self.slug} tensors"
        reject_unknown(
            tensors, TENSOR_NAMES, where=where,
            takes=f"gptq takes {', '.join(TENSOR_NAMES)} (g_idx and bias optional)",
        )
        require_tensors(tensors, ("qweight", "qzeros", "scales"), where=where)
        pf = self.pack_factor
        qweight = require_tensor("qweight", tensors["qweight"], dtypes=(self.pack_dtype,), where=where)
        scales = require_tensor("scales", tensors["scales"], dtypes=_SCALE_DTYPES, where=where)
        if qweight.dim() != 2:
            raise TensorFormatError(f"{where}: qweight: expected 2-D [I/{pf}, O], got {describe(qweight)}")
        if scales.dim() != 2:
            raise TensorFormatError(f"{where}: scales: expected 2-D [G, O], got {describe(scales)}")
        in_features, out_features = qweight.shape[0] * pf, qweight.shape[1]
        if in_features == 0 or out_features == 0:
            raise TensorFormatError(f"{where}: qweight: expected non-empty, got {describe(qweight)}")
        groups = self.num_groups(in_features)
        if out_features % pf:
            raise TensorFormatError(
                f"{where}: out_features = {out_features} (qweight.shape[1]) must be a multiple of "
                f"{pf} to pack qzeros"
            )
        require_tensor("scales", scales, shape=(groups, out_features), where=where)
        require_tensor(
            "qzeros", tensors["qzeros"], shape=(groups, out_features // pf),
            dtypes=(self.pack_dtype,), where=where,
        )
        g_idx = tensors.get("g_idx")
        if g_idx is not None:
            require_tensor("g_idx", g_idx, shape=(in_features,), dtypes=(torch.int32, torch.int64), where=where)
            if in_features and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
                raise TensorFormatError(
                    f"{where}: g_idx: expected values in [0, {groups}) for group_size="
                    f"{self.group_size} over {in_features} inputs, got range "
                    f"[{int(g_idx.min())}, {int(g_idx.max())}]"
                )
        bias = tensors.get("bias")
        if bias is not None:
            require_tensor("bias", bias, shape=(out_features,), dtypes=_SCALE_DTYPES, where=where)
        devices = {t.device for t in tensors.values()}
        if len(devices) > 1:
            raise TensorFormatError(f"{where}: tensors on several devices {sorted(map(str, devices))}")
        if not torch.isfinite(scales).all():
            raise TensorFormatError(f"{where}: scales: contains NaN or Inf")
        return {"K": in_features, "N": out_features}

    # --- unpacking, shared by the dequantizer and by kernels' transforms -----------------

    def unpack_weight(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Codes ``[I, O]`` int32 in ``[0, 2^bits)``."""
        return unpack_codes(tensors["qweight"], self.bits, dim=0)

    def unpack_zeros(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """True integer zero points ``[G, O]`` int32 (v1's −1 offset undone, wrapped)."""
        stored = unpack_codes(tensors["qzeros"], self.bits, dim=1)
        if self.checkpoint_format == "v1":
            return (stored + 1) & self.maxq
        return stored

    def group_index(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``g_idx`` as int64; the trivial ``i // group_size`` when the checkpoint has none."""
        g_idx = tensors.get("g_idx")
        if g_idx is not None:
            return g_idx.to(torch.int64)
        in_features = tensors["qweight"].shape[0] * self.pack_factor
        gs = self.effective_group_size(in_features)
        return torch.arange(in_features, device=tensors["qweight"].device) // gs

    # --- golden math ------------------------------------------------------------------------

    def dequantize(
        self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """Dense ``W [O, I]`` (nn.Linear layout) in ``dtype``."""
        self.validate(tensors)
        q = self.unpack_weight(tensors).to(dtype)  # [I, O]
        z = self.unpack_zeros(tensors).to(dtype)  # [G, O]
        s = tensors["scales"].to(dtype)  # [G, O]
        g = self.group_index(tensors)
        return ((q - z[g]) * s[g]).T.contiguous()

    def quantize(
        self,
        weight: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        perm: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        from .quantize import quantize_rtn

        return quantize_rtn(self, weight, generator=generator, perm=perm)
