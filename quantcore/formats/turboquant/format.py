"""TurboQuant: rotated, norm-scaled 4-bit codebook indices, with an optional residual pass.

The weight is ``W [N, K]`` (nn.Linear layout: N out-features, K in-features), split along
K into ``G = K / d`` groups of ``d = group_size`` columns. For each (row n, group g) the
slice ``w = W[n, g·d:(g+1)·d]`` is stored as its norm ‖w‖ and the 4-bit indices of
``√d · Π_g (w / ‖w‖)`` into the Lloyd-Max codebook of N(0, 1) (docs/formats/turboquant.md).

Stored tensors
==============

=================  ==============  ======================================================
indices            [N, K/2] uint8  two indices per byte: rotated coordinate 2j of a row in
                                   the low nibble of byte j, 2j+1 in the high nibble
                                   (coordinates of group g are columns g·d … g·d+d−1)
norms              [N, G]          ‖w‖ of each (row, group) slice; float16 by default
                                   (``norm_dtype``), bf16 and fp32 accepted
rotation           [R, d, d] fp32  Π_g; R = 1 (one rotation shared by every group, the
                                   default) or R = G (``rotation_per_group``)
codebook           [2^bits] fp32   the centroids, ascending; shared by both passes
residual_indices   as indices      pass 2 (``residual=True``): the same encoding of
residual_norms     as norms        W − Ŵ₁, the error pass 1 left,
residual_rotation  as rotation     under its own, independent rotation
bias               [N]             optional
=================  ==============  ======================================================

Dequantization, per pass: ``Ŵ[n, g·d:(g+1)·d] = norms[n, g] / √d · (c[idx[n, g]] @ Π_g)``
with ``c[idx]`` the row of d centroids; the stored weight is the sum of the passes.
In a matmul the rotation moves to the input (``x_g Π_gᵀ``), which is how every kernel
runs it without building Ŵ.

Rotation storage: the matrices, not a seed
==========================================

A seed is compact but makes the checkpoint's meaning depend on one RNG stream
(torch's, which is not promised stable across versions or devices) and on the QR
routine's rounding; a reader in another framework could not rebuild Π at all. A
randomised Hadamard transform regenerates exactly from a seed of sign bits, but only for
power-of-two d, and it is not the Haar rotation the paper's analysis assumes. Stored
float32 matrices cost ``4·d²`` bytes per rotation: with the default single shared
rotation that is 64 KiB per layer at d = 128 (0.03 bits per weight at K = N = 4096),
and any reader gets the exact Π the quantizer used. Sharing one Π across groups is
also what the paper does (one rotation for all vectors); ``rotation_per_group=True``
stores independent Π_g at ``32·d/N`` bits per weight for those who want them.

Indices occupy a nibble whatever ``bits`` is (2, 3 or 4), so every kernel reads one
layout; below 4 bits that trades storage for simplicity, and the indices must stay
below ``2^bits`` (checked).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ...errors import TensorFormatError
from ...tensors import check_stored, describe, ieee_div, require_tensor, require_tensors
from ..base import Format
from .indices import pack_indices, unpack_indices

if TYPE_CHECKING:
    from ..sharding import Shard

__all__ = ["PASS_TENSORS", "RESIDUAL_PREFIX", "TurboQuant", "pack_indices", "unpack_indices"]

#: The tensors of one pass; pass 2 prefixes them with ``RESIDUAL_PREFIX``.
PASS_TENSORS = ("indices", "norms", "rotation")
RESIDUAL_PREFIX = "residual_"
_NORM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_CODEBOOK_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_BIAS_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Largest tolerated ‖ΠᵀΠ − I‖_max for a stored rotation held in float32.
_ORTHOGONALITY_TOL = 1e-3


@dataclass(frozen=True)
class TurboQuant(Format):
    """One TurboQuant parameterisation."""

    name: ClassVar[str] = "turboquant"
    version: ClassVar[int] = 1

    bits: int = 4
    group_size: int = 128
    residual: bool = False
    rotation_per_group: bool = False
    norm_dtype: torch.dtype = torch.float16

    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = (2, 3, 4)
    shard_dims: ClassVar[tuple[str, ...]] = ("K", "N")

    def __post_init__(self) -> None:
        if self.bits not in self.SUPPORTED_BITS:
            raise TensorFormatError(
                f"turboquant bits: expected one of {self.SUPPORTED_BITS} (indices are stored "
                f"one per nibble), got {self.bits!r}"
            )
        if not isinstance(self.group_size, int) or self.group_size < 2 or self.group_size % 2:
            raise TensorFormatError(
                f"turboquant group_size: expected an even int >= 2 (two indices per byte "
                f"within a group), got {self.group_size!r}"
            )
        if self.norm_dtype not in _NORM_DTYPES:
            raise TensorFormatError(
                f"turboquant norm_dtype: expected float16, bfloat16 or float32, got {self.norm_dtype}"
            )

    # --- derived quantities -----------------------------------------------------------

    @property
    def slug(self) -> str:
        parts = [f"tq{self.bits}", f"g{self.group_size}"]
        if self.residual:
            parts.append("res")
        if self.rotation_per_group:
            parts.append("pg")
        if self.norm_dtype != torch.float16:
            parts.append("n" + {torch.bfloat16: "bf16", torch.float32: "fp32"}[self.norm_dtype])
        return "-".join(parts)

    @property
    def levels(self) -> int:
        return 1 << self.bits

    @property
    def passes(self) -> tuple[str, ...]:
        """Tensor-name prefix of each pass: ``("",)`` or ``("", "residual_")``."""
        return ("", RESIDUAL_PREFIX) if self.residual else ("",)

    def tensor_names(self) -> tuple[str, ...]:
        names = [p + t for p in self.passes for t in PASS_TENSORS]
        return (*names, "codebook", "bias")

    def num_rotations(self, in_features: int) -> int:
        return in_features // self.group_size if self.rotation_per_group else 1

    def shard_tensors(
        self, tensors: Mapping[str, torch.Tensor], *, dim: str, rank: int, world: int, **extra: Any
    ) -> Shard:
        from .shard import shard_turboquant

        return shard_turboquant(self, tensors, dim=dim, rank=rank, world=world)

    concatenates: ClassVar[bool] = True

    def concat_tensors(
        self, parts: Sequence[Mapping[str, torch.Tensor]], *, names: Sequence[str] | None = None
    ) -> dict[str, torch.Tensor]:
        from .shard import concat_turboquant

        return concat_turboquant(self, parts, names=names)

    # --- validation ---------------------------------------------------------------------

    def validate(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
        where = f"{self.slug} tensors"
        allowed = self.tensor_names()
        unknown = sorted(set(tensors) - set(allowed))
        if unknown:
            hint = "" if self.residual or not any(n.startswith(RESIDUAL_PREFIX) for n in unknown) else (
                " (residual tensors given to a format with residual=False)"
            )
            raise TensorFormatError(
                f"{where}: unexpected tensor(s) {', '.join(unknown)}{hint}; {self.slug} takes "
                f"{', '.join(allowed)} (bias optional)"
            )
        require_tensors(tensors, [n for n in allowed if n != "bias"], where=where)
        indices = require_tensor("indices", tensors["indices"], dtypes=(torch.uint8,), where=where)
        if indices.dim() != 2 or indices.numel() == 0:
            raise TensorFormatError(f"{where}: indices: expected non-empty 2-D [N, K/2] uint8, got {describe(indices)}")
        n, k = indices.shape[0], indices.shape[1] * 2
        d = self.group_size
        if k % d:
            raise TensorFormatError(
                f"{where}: in_features K = {k} (2 × indices.shape[1]) is not a multiple of "
                f"group_size = {d}"
            )
        groups = k // d
        codebook = require_tensor(
            "codebook", tensors["codebook"], shape=(self.levels,), dtypes=_CODEBOOK_DTYPES, where=where
        )
        if not torch.isfinite(codebook).all():
            raise TensorFormatError(f"{where}: codebook: contains NaN or Inf")
        # Every shape first, then values: a small tensor of the wrong shape is refused
        # before a large one is scanned.
        for prefix in self.passes:
            self._pass_shapes(tensors, prefix, n, k, groups, where)
        bias = tensors.get("bias")
        if bias is not None:
            require_tensor("bias", bias, shape=(n,), dtypes=_BIAS_DTYPES, where=where)
        for prefix in self.passes:
            self._pass_values(tensors, prefix, where)
        devices = {t.device for t in tensors.values()}
        if len(devices) > 1:
            raise TensorFormatError(f"{where}: tensors on several devices {sorted(map(str, devices))}")
        return {"K": k, "N": n}

    def validate_pass(self, tensors: Mapping[str, torch.Tensor], prefix: str = "") -> dict[str, int]:
        """One pass's tensors on their own (``indices``, ``norms``, ``rotation`` under
        ``prefix``), as a transform of a single pass takes them; returns K and N."""
        where = f"{self.slug} pass tensors"
        names = [prefix + t for t in PASS_TENSORS]
        if not isinstance(tensors, Mapping):
            raise TensorFormatError(f"{where}: tensors: expected a mapping of names to tensors, got {type(tensors).__name__}")
        require_tensors(tensors, names, where=where)
        one = {name: tensors[name] for name in names}
        check_stored(one, where=where)
        indices = require_tensor(prefix + "indices", one[prefix + "indices"], dtypes=(torch.uint8,), where=where)
        if indices.dim() != 2 or indices.numel() == 0:
            raise TensorFormatError(
                f"{where}: {prefix}indices: expected non-empty 2-D [N, K/2] uint8, got {describe(indices)}"
            )
        n, k = indices.shape[0], indices.shape[1] * 2
        if k % self.group_size:
            raise TensorFormatError(
                f"{where}: in_features K = {k} (2 × {prefix}indices.shape[1]) is not a multiple of "
                f"group_size = {self.group_size}"
            )
        self._validate_pass(one, prefix, n, k, k // self.group_size, where)
        return {"K": k, "N": n}

    def _validate_pass(
        self, tensors: Mapping[str, torch.Tensor], prefix: str, n: int, k: int, groups: int, where: str
    ) -> None:
        self._pass_shapes(tensors, prefix, n, k, groups, where)
        self._pass_values(tensors, prefix, where)

    def _pass_shapes(
        self, tensors: Mapping[str, torch.Tensor], prefix: str, n: int, k: int, groups: int, where: str
    ) -> None:
        d = self.group_size
        require_tensor(prefix + "indices", tensors[prefix + "indices"], shape=(n, k // 2), dtypes=(torch.uint8,),
                       where=where)
        require_tensor(prefix + "norms", tensors[prefix + "norms"], shape=(n, groups), dtypes=(self.norm_dtype,),
                       where=where)
        require_tensor(prefix + "rotation", tensors[prefix + "rotation"], shape=(self.num_rotations(k), d, d),
                       dtypes=(torch.float32,), where=where)

    def _pass_values(self, tensors: Mapping[str, torch.Tensor], prefix: str, where: str) -> None:
        d = self.group_size
        indices, norms, rotation = (tensors[prefix + t] for t in ("indices", "norms", "rotation"))
        if self.bits < 4:
            top = max(int((indices & 0xF).max()), int((indices >> 4).max()))
            if top >= self.levels:
                raise TensorFormatError(
                    f"{where}: {prefix}indices: expected values below {self.levels} for bits={self.bits}, "
                    f"found {top}"
                )
        if not torch.isfinite(norms).all():
            raise TensorFormatError(f"{where}: {prefix}norms: contains NaN or Inf")
        r = rotation.float()
        eye = torch.eye(d, device=r.device)
        off = (r @ r.transpose(-1, -2) - eye).abs().amax().item()
        if not off <= _ORTHOGONALITY_TOL:
            raise TensorFormatError(
                f"{where}: {prefix}rotation: expected orthogonal matrices, max |Π Πᵀ − I| = {off:.3g} "
                f"(tolerance {_ORTHOGONALITY_TOL})"
            )

    # --- golden math ------------------------------------------------------------------------

    def dequantize(
        self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """Dense ``W [N, K]`` (nn.Linear layout) in ``dtype``: the sum of the passes."""
        dims = self.validate(tensors)
        weight = torch.zeros(dims["N"], dims["K"], dtype=dtype, device=tensors["indices"].device)
        codebook = tensors["codebook"].to(dtype)
        for prefix in self.passes:
            weight += self.dequantize_pass(tensors, prefix, codebook, dtype)
        return weight

    def dequantize_pass(
        self,
        tensors: Mapping[str, torch.Tensor],
        prefix: str,
        codebook: torch.Tensor,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """One pass's contribution ``[N, K]``; no validation (``dequantize`` does it)."""
        d = self.group_size
        idx = unpack_indices(tensors[prefix + "indices"])
        n, k = idx.shape
        centroids = codebook[idx].view(n, k // d, d)  # [N, G, d]
        # Contiguous: a matmul's summation order follows the operands' layout, and the
        # golden result must not depend on how the checkpoint's tensors are strided.
        rotation = tensors[prefix + "rotation"].to(dtype).contiguous()  # [R, d, d]
        if rotation.shape[0] == 1:
            unit = centroids @ rotation[0]
        else:
            unit = torch.einsum("ngj,gjk->ngk", centroids, rotation)
        scale = ieee_div(tensors[prefix + "norms"].to(dtype), math.sqrt(d))  # the same bits on every device
        return (unit * scale.unsqueeze(-1)).reshape(n, k)

    def quantize(
        self, weight: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        from .quantize import quantize_weight

        return quantize_weight(self, weight, generator=generator)
