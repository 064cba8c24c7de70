"""TensorRT-LLM MoE, INT8 weights with group-wise scales (and optional zeros).

Stored tensors, logical (unpreprocessed) form, E experts, reduction dim K, output dim N,
G = ceil(K / group_size) groups along K:

=========  ============  ===================================================
qweight    [E, K, N]     int8, *signed* codes q in [-128, 127], row-major
scales     [E, G, N]     ``scale_dtype`` (fp16 or bf16, as the activations)
zeros      [E, G, N]     ``scale_dtype``; asymmetric only, absent otherwise
=========  ============  ===================================================

Dequantization, for k in group g = k // group_size::

    W[e, k, n] = q[e, k, n] · scales[e, g, n]  (+ zeros[e, g, n] when asymmetric)

What "q" is. The seed writes the symmetric rule as ``(q − 128) · scale`` and the
asymmetric one as ``q · scale + zero``. Both speak of the same signed code: in the
symmetric formula q is the *stored biased byte* u = q_signed + 128 that TensorRT-LLM's
preprocessor writes (its step "+128 bias", see ``quantcore.backends.trtllm_moe.
preprocess``), so ``u − 128`` is the signed code again; in the asymmetric formula q is
the signed code directly. That is how TensorRT-LLM's own reference reads them
(tests/unittest/trt/quantization/test_weight_only_groupwise_quant_matmul.py: ``ref =
unprocessed_int8_weight · scale (+ zero)``, the kernel's converter having removed the
bias before scale and zero are applied). So this format stores the signed code — the
very tensor the preprocessor takes — and the zero is a float offset added after
scaling, not an integer zero point. A GPTQ/AWQ integer zero point z on unsigned codes
c = q + 128 maps to ``zero = (128 − z) · scale``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ...errors import TensorFormatError
from ...tensors import describe, reject_unknown, require_tensor, require_tensors
from ..base import Format

if TYPE_CHECKING:
    from ..sharding import Shard

__all__ = ["TRTLLMMoE"]

SCALE_DTYPES = (torch.float16, torch.bfloat16)
TENSOR_NAMES = ("qweight", "scales", "zeros")


@dataclass(frozen=True)
class TRTLLMMoE(Format):
    """One parameterisation of the TensorRT-LLM MoE INT8 group-wise format."""

    name: ClassVar[str] = "trtllm_moe"
    version: ClassVar[int] = 1
    op: ClassVar[str] = "moe"

    group_size: int = 128
    sym: bool = True
    scale_dtype: torch.dtype = torch.float16

    #: The group sizes TensorRT-LLM's fine-grained mixed GEMM kernels are built for.
    SUPPORTED_GROUP_SIZES: ClassVar[tuple[int, ...]] = (64, 128)
    bits: ClassVar[int] = 8
    shard_dims: ClassVar[tuple[str, ...]] = ("K", "N", "E")
    shard_by_index: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.group_size not in self.SUPPORTED_GROUP_SIZES:
            raise TensorFormatError(
                f"trtllm_moe group_size: expected one of {self.SUPPORTED_GROUP_SIZES}, got {self.group_size!r}"
            )
        if not isinstance(self.sym, bool):
            raise TensorFormatError(f"trtllm_moe sym: expected a bool, got {self.sym!r}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise TensorFormatError(
                f"trtllm_moe scale_dtype: expected float16 or bfloat16, got {self.scale_dtype}"
            )

    @property
    def slug(self) -> str:
        dt = "fp16" if self.scale_dtype == torch.float16 else "bf16"
        return f"trtllm_moe-int8-g{self.group_size}-{'sym' if self.sym else 'asym'}-{dt}"

    def num_groups(self, k: int) -> int:
        return -(-k // self.group_size)

    def shard_tensors(
        self, tensors: Mapping[str, torch.Tensor], *, dim: str, rank: int, world: int, **extra: Any
    ) -> Shard:
        from .shard import shard_trtllm_moe

        return shard_trtllm_moe(self, tensors, dim=dim, rank=rank, world=world, index=extra.get("index"))

    # --- validation ---------------------------------------------------------------------

    def validate(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
        where = f"{self.slug} tensors"
        reject_unknown(
            tensors, TENSOR_NAMES, where=where, takes="trtllm_moe takes qweight, scales and (asymmetric only) zeros"
        )
        require_tensors(tensors, ("qweight", "scales") + (() if self.sym else ("zeros",)), where=where)
        if self.sym and "zeros" in tensors:
            raise TensorFormatError(f"{where}: zeros: given, but the format is symmetric (sym=True)")
        qweight = require_tensor("qweight", tensors["qweight"], dtypes=(torch.int8,), where=where)
        if qweight.dim() != 3 or qweight.numel() == 0:
            raise TensorFormatError(f"{where}: qweight: expected non-empty 3-D [E, K, N], got {describe(qweight)}")
        e, k, n = qweight.shape
        groups = self.num_groups(k)
        names = ("scales",) if self.sym else ("scales", "zeros")
        for name in names:
            t = require_tensor(name, tensors[name], shape=(e, groups, n), dtypes=(self.scale_dtype,), where=where)
            if not torch.isfinite(t).all():
                raise TensorFormatError(f"{where}: {name}: contains NaN or Inf")
        devices = {t.device for t in tensors.values()}
        if len(devices) > 1:
            raise TensorFormatError(f"{where}: tensors on several devices {sorted(map(str, devices))}")
        return {"E": e, "K": k, "N": n}

    # --- golden math ------------------------------------------------------------------------

    def expand_groups(self, t: torch.Tensor, k: int) -> torch.Tensor:
        """``[E, G, N]`` → ``[E, K, N]``: each group's row repeated over its K rows."""
        return t.repeat_interleave(self.group_size, dim=1)[:, :k, :]

    def dequantize(
        self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """Dense ``W [E, K, N]`` in ``dtype`` (computed in float64, then cast)."""
        _, k, _ = self.validate(tensors).values()
        w = tensors["qweight"].double() * self.expand_groups(tensors["scales"].double(), k)
        if not self.sym:
            w = w + self.expand_groups(tensors["zeros"].double(), k)
        return w.to(dtype)

    def quantize(
        self, weight: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        from .quantize import quantize_groupwise

        return quantize_groupwise(self, weight)
