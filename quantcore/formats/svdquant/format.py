"""SVDQuant W4A4 activations: the pre-GEMM format (docs/formats/svdquant.md).

The op ``act_quant_lora`` (:mod:`quantcore.ops.act_quant_lora`) turns the activation
``x [M, N]`` (fp16/bf16) of an SVDQuant linear into what its W4A4 GEMM consumes. This
format is that output, and the per-layer tensors the op reads.

Per-layer tensors (what ``validate`` and a kernel's ``prepare`` take)
=====================================================================

=========  ========  =========================================================
lora_down  [N, R]    fp16/bf16; the LoRA down-projection with diag(1/smooth)
                     already absorbed offline. R = 0 means no LoRA branch.
                     Kernels use it in the activation dtype.
smooth     [N]       fp16/bf16, optional; finite and non-zero
=========  ========  =========================================================

Outputs, M_pad = M rounded up to a multiple of ``pad_size`` (256)
================================================================

============  ====================  ===============================================
qout          [M_pad, N/2] uint8    two 4-bit codes per byte, element 2j in the low
                                    nibble, 2j+1 in the high nibble
oscales       [N/B, M_pad]          one scale per (block of B elements, row): the
                                    transpose of the natural [M_pad, N/B].
                                    NVFP4: float8_e4m3fn, B = 16; INT4: float16, B = 64
lora_act_out  [M_pad, R] float32    x @ lora_down on the *raw* x (see below)
============  ====================  ===============================================

Padding rows (M ≤ row < M_pad) are all zero bytes: codes 0, scales 0, LoRA rows 0.

The quantized value is ``v = x · (1 / smooth)`` (no smooth: ``v = x``): the reciprocal
is taken once per column in float32, then multiplied, so each element costs one product
instead of a division. ``lora_act_out`` reads the raw ``x``, not ``v``: the offline
packer already absorbed diag(1/smooth) into ``lora_down`` (docs/formats/svdquant.md: a load-bearing
asymmetry). ``amax`` is ``max |v|`` over the block. Everything below is float32, each
step one correctly rounded operation.

NVFP4 (``fp4=True``): E2M1 codes, block 16, fp8 e4m3 scales
-----------------------------------------------------------
- ``s = amax / 6``; stored scale ``s8 = e4m3(min(s, 448))``, round to nearest even (as
  torch's ``float8_e4m3fn`` conversion). Scales beyond 448 saturate (satfinite).
- A block whose scale rounds to zero (``s ≤ 2⁻¹⁰``, an all-zero block included) stores
  the smallest subnormal ``2⁻⁹`` instead, so every block divides by a non-zero scale and
  tiny blocks keep their codes. An all-zero block is scale 0x01 with codes 0. This floor
  is the project's choice (the public sources leave the zero block open); it is not torchao's.
  torchao 0.18's single-level ``nvfp4_quantize`` clamps *every* block scale to at least
  ``2⁻⁶`` (fp8 e4m3's smallest normal, ``torch.finfo(torch.float8_e4m3fn).tiny``), so
  any block with ``s < 2⁻⁶`` gets that scale, and it multiplies by the reciprocal of the
  stored scale instead of dividing. The golden quantizer offers that convention for
  comparing with torchao's output — ``quantize(x, convention="torchao")`` — and the
  kernels write this format's.
- Elements are **divided by the stored scale**: ``y = v / float(s8)`` (IEEE division,
  not a reciprocal), so ``code × s8`` is the best this code set can do for ``x``. The
  code is E2M1 of ``y``: nearest of {0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to even (0.25 → 0,
  0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4), saturating at 6; bit 3 is the
  IEEE sign of ``y`` (so −0 and small negatives give 0x8, as hardware conversions do).

INT4 (``fp4=False``): signed codes, block 64, fp16 scales (nunchaku's INT4 path)
-------------------------------------------------------------------------------
- ``code = clamp(round_half_even(v · (7 / amax)), −8, 7)``: the product with ``7/amax``,
  not a division by the scale; two's-complement nibbles.
- ``scale = max(amax / 7, 1e-10)`` stored as float16 (round to nearest even). The
  1e-10 floor is 0 once stored, so an all-zero block is scale 0 with codes 0; a block
  too small for ``7 / amax`` to be finite (amax < 2.1e-38) likewise has codes 0 (its
  stored scale is 0 anyway). Scales are float16 whatever the activation dtype (the
  format's definition); a block with amax above 7 · 65504 stores +inf, which the consumer
  sees as inf rather than as a silently wrong finite value.

Non-finite values (NaN, ±Inf in ``v``, including those made by a zero smooth)
---------------------------------------------------------------------------
The block's scale is NaN (fp8 0x7F; fp16 0x7E00) and its codes are 0, so the block
dequantizes to NaN and the next GEMM's output is NaN exactly where a float GEMM's would
be non-finite; the other blocks of the row are unaffected. ``lora_act_out`` is the IEEE
result of the matmul (NaN/Inf propagate). Refusing instead would cost a full read and a
device sync per call.

Not accepted (refused with the reason): N not a multiple of the block (16 / 64);
activations other than fp16/bf16; ``smooth`` with zero, NaN or Inf entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ...errors import TensorFormatError
from ...tensors import check_stored, describe, reject_unknown, require_tensor, require_tensors
from ..base import Format

if TYPE_CHECKING:
    from ..sharding import Shard
from . import numerics

__all__ = ["SVDQuantAct"]

FLOAT_DTYPES = (torch.float16, torch.bfloat16)
TENSOR_NAMES = ("lora_down", "smooth")
OUTPUT_NAMES = ("qout", "oscales")


@dataclass(frozen=True)
class SVDQuantAct(Format):
    """One parameterisation: ``fp4=True`` NVFP4 (block 16, fp8 scales) or ``False``
    INT4 (block 64, fp16 scales); ``pad_size`` rows of output padding."""

    name: ClassVar[str] = "svdquant"
    version: ClassVar[int] = 1
    op: ClassVar[str] = "act_quant_lora"

    fp4: bool = True
    pad_size: int = 256

    #: The activation's channels: the pre-GEMM of a row-parallel W4A4 linear (see .shard).
    shard_dims: ClassVar[tuple[str, ...]] = ("N",)

    def __post_init__(self) -> None:
        if not isinstance(self.fp4, bool):
            raise TensorFormatError(f"svdquant fp4: expected a bool, got {self.fp4!r}")
        if not isinstance(self.pad_size, int) or self.pad_size < 1:
            raise TensorFormatError(f"svdquant pad_size: expected a positive int, got {self.pad_size!r}")

    @property
    def block(self) -> int:
        """Elements per scale along N: 16 (NVFP4) or 64 (INT4)."""
        return 16 if self.fp4 else 64

    @property
    def scale_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn if self.fp4 else torch.float16

    @property
    def slug(self) -> str:
        pad = "" if self.pad_size == 256 else f"-pad{self.pad_size}"
        return f"svdquant-{'nvfp4' if self.fp4 else 'int4'}{pad}"

    def padded_rows(self, m: int) -> int:
        return numerics.padded_rows(m, self.pad_size)

    def shard_tensors(
        self, tensors: Mapping[str, torch.Tensor], *, dim: str, rank: int, world: int, **extra: Any
    ) -> Shard:
        from .shard import shard_svdquant

        return shard_svdquant(self, tensors, dim=dim, rank=rank, world=world)

    # --- validation -------------------------------------------------------------------------

    def check_n(self, n: int, what: str) -> None:
        if n <= 0 or n % self.block:
            raise TensorFormatError(
                f"{what}: N={n} must be a positive multiple of the {'NVFP4' if self.fp4 else 'INT4'} "
                f"block size {self.block}"
            )

    def validate(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """The per-layer tensors: ``lora_down [N, R]`` (R may be 0) and optional
        ``smooth [N]``. Returns ``{"N": N, "R": R}``."""
        where = f"{self.slug} tensors"
        reject_unknown(tensors, TENSOR_NAMES, where=where, takes="svdquant takes lora_down and (optional) smooth")
        require_tensors(tensors, ("lora_down",), where=where)
        lora = require_tensor("lora_down", tensors["lora_down"], dtypes=FLOAT_DTYPES, where=where)
        if lora.dim() != 2:
            raise TensorFormatError(f"{where}: lora_down: expected 2-D [N, R], got {describe(lora)}")
        n, r = lora.shape
        self.check_n(n, f"{where}: lora_down")
        if "smooth" in tensors:
            smooth = self.check_smooth(tensors["smooth"], n, where)
            if smooth.device != lora.device:
                raise TensorFormatError(
                    f"{where}: smooth on {smooth.device}, lora_down on {lora.device}: expected one device"
                )
        return {"N": n, "R": r}

    def check_smooth(self, smooth: object, n: int, where: str) -> torch.Tensor:
        """``smooth [N]`` fp16/bf16 with finite, non-zero entries."""
        t = require_tensor("smooth", smooth, shape=(n,), dtypes=FLOAT_DTYPES, where=where)
        bad = ~torch.isfinite(t) | (t == 0)
        if bool(bad.any()):
            first = int(bad.nonzero()[0, 0])
            raise TensorFormatError(
                f"{where}: smooth: expected finite non-zero entries, got {int(bad.sum())} bad "
                f"(first at [{first}] = {float(t[first])})"
            )
        return t

    def validate_output(self, tensors: Mapping[str, torch.Tensor]) -> tuple[int, int]:
        """``qout`` and ``oscales`` as the op writes them; returns ``(M_pad, N)``."""
        where = f"{self.slug} output"
        check_stored(tensors, where=where)
        reject_unknown(tensors, OUTPUT_NAMES, where=where, takes="svdquant output is qout and oscales")
        require_tensors(tensors, OUTPUT_NAMES, where=where)
        qout = require_tensor("qout", tensors["qout"], dtypes=(torch.uint8,), where=where)
        if qout.dim() != 2:
            raise TensorFormatError(f"{where}: qout: expected 2-D [M_pad, N/2], got {describe(qout)}")
        m_pad, n = qout.shape[0], 2 * qout.shape[1]
        if m_pad % self.pad_size:
            raise TensorFormatError(f"{where}: qout: rows {m_pad} are not a multiple of pad_size {self.pad_size}")
        self.check_n(n, f"{where}: qout")
        require_tensor("oscales", tensors["oscales"], shape=(n // self.block, m_pad),
                       dtypes=(self.scale_dtype,), where=where)
        return m_pad, n

    # --- golden math ------------------------------------------------------------------------

    def quantize(  # type: ignore[override]
        self,
        x: torch.Tensor,
        *,
        smooth: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        convention: str = "quantcore",
    ) -> dict[str, torch.Tensor]:
        """Golden quantizer of an activation ``x [M, N]`` (fp16/bf16): ``qout`` and
        ``oscales`` padded to ``pad_size`` rows. ``generator`` is unused (deterministic).
        ``convention="torchao"`` (NVFP4 only) applies torchao 0.18's scale rule instead
        of this format's (see the module docstring): a reference, not the format."""
        where = f"{self.slug} quantize"
        x = require_tensor("x", x, dtypes=FLOAT_DTYPES, where=where)
        if x.dim() != 2 or x.device.type == "meta":
            raise TensorFormatError(f"{where}: x: expected a 2-D [M, N] tensor with data, got {describe(x)}")
        self.check_n(x.shape[1], f"{where}: x")
        if smooth is not None:
            if isinstance(smooth, torch.Tensor) and smooth.device != x.device:  # before reading its values
                raise TensorFormatError(f"{where}: smooth on {smooth.device}, x on {x.device}: expected one device")
            smooth = self.check_smooth(smooth, x.shape[1], where)
        if convention not in numerics.CONVENTIONS or (convention != "quantcore" and not self.fp4):
            raise TensorFormatError(
                f"{where}: convention: expected one of {numerics.CONVENTIONS} (torchao: NVFP4 only), got {convention!r}"
            )
        return numerics.quantize_activation(x, smooth, fp4=self.fp4, block=self.block, pad_size=self.pad_size,
                                            convention=convention)

    def dequantize(
        self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """``code × scale`` as ``[M_pad, N]`` in ``dtype``: the smoothed activation
        ``x / smooth`` as the next GEMM sees it (padding rows are 0)."""
        self.validate_output(tensors)
        dense = numerics.dequantize_activation(tensors["qout"], tensors["oscales"], fp4=self.fp4, block=self.block)
        return dense.to(dtype)
