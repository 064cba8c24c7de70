"""``preprocess_weights_for_mixed_gemm``: TensorRT-LLM's CUTLASS weight preprocessor for
mixed-input GEMM, bit for bit, and its exact inverse.

Followed: NVIDIA/TensorRT-LLM ``cpp/tensorrt_llm/kernels/cutlass_kernels/
cutlass_preprocessors.cpp`` (the version with ``QuantType`` W8_A16 / W4_A16 / W4_AFP8 and
``force_interleave``) and ``cutlass_extensions/gemm/kernel/mixed_gemm_B_layout.h``.

Input: row-major *signed* codes, ``[K, N·bits/8]`` or ``[E, K, N·bits/8]`` int8 (for
int4, two codes per byte, the even column in the low nibble); K is the reduction dim.
Output: int8 of the same shape and byte count, the layout TensorRT-LLM's kernels read;
TensorRT-LLM's loaders view it as fp16 (:func:`as_plugin_tensor`). Experts are
independent. The steps, each in its own module with its index formula:

1. :mod:`.permute_rows`   — if the layout uses LDSM (75 <= arch < 90)
2. :mod:`.transpose`      — if B is column-major (every supported arch)
3. :mod:`.interleave`     — if more than one column is interleaved (75 <= arch < 90)
4. :mod:`.bias`           — +128 / +8 and register interleave (70 <= arch < 90)

and :mod:`.layout` says which apply for an arch, after ``force_interleave`` has turned
SM 90 into SM 80 (the MoE path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantcore.errors import UnsupportedProblemError
from quantcore.tensors import describe
from quantcore.transform import Transform

from .bias import add_bias_and_interleave, remove_bias_and_deinterleave
from .interleave import deinterleave_columns, interleave_columns
from .layout import LayoutDetails, effective_arch, layout_details
from .permute_rows import permute_rows, unpermute_rows
from .quant_type import QuantType
from .transpose import subbyte_transpose

__all__ = [
    "CutlassMixedGemmLayout",
    "as_plugin_tensor",
    "preprocess_weights_for_mixed_gemm",
    "unpreprocess_weights_for_mixed_gemm",
]


def _as_experts(weight: torch.Tensor) -> torch.Tensor:
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.int8 or weight.dim() not in (2, 3):
        got = describe(weight) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise UnsupportedProblemError(f"weight: expected int8 [K, N·bits/8] or [E, K, N·bits/8], got {got}")
    return weight.unsqueeze(0) if weight.dim() == 2 else weight


def check_shape(k: int, n: int, details: LayoutDetails) -> None:
    """The preprocessor's own shape checks, for K rows and N columns (elements)."""
    qt, bits = details.quant_type, details.quant_type.bits
    need: list[str] = []
    if details.uses_imma_ldsm:
        if k % qt.rows_per_mma:
            need.append(f"K % {qt.rows_per_mma} == 0 (row permutation blocks)")
        if n % 8:
            need.append("N % 8 == 0 (MMA N)")
    if details.column_major and ((n * bits // 8) % 32 or (k * bits // 8) % 32):
        need.append(f"K and N multiples of {32 * 8 // bits} (transpose moves 32-byte vectors)")
    if details.columns_interleaved > 1 and k % details.rows_per_column_tile:
        need.append(f"K % {details.rows_per_column_tile} == 0 (column tiles)")
    if n * bits % 8:
        need.append(f"N·{bits} a whole number of bytes")
    if need:
        raise UnsupportedProblemError(
            f"weight: TensorRT-LLM's preprocessor for {qt.value} on SM {details.arch} needs "
            f"{'; '.join(need)}; got K={k}, N={n}"
        )


@dataclass(frozen=True)
class CutlassMixedGemmLayout(Transform[torch.Tensor, torch.Tensor]):
    """The preprocessor for one (weight type, GPU architecture, force_interleave)."""

    quant_type: QuantType = QuantType.W8_A16
    arch: int = 80
    force_interleave: bool = False

    name = "cutlass_mixed_gemm_preprocess"

    @property
    def details(self) -> LayoutDetails:
        return layout_details(self.quant_type, effective_arch(self.arch, self.force_interleave))

    def apply(self, weight: torch.Tensor) -> torch.Tensor:
        details, qt = self.details, self.quant_type
        w = _as_experts(weight)
        _, k, nb = w.shape
        check_shape(k, nb * qt.elements_per_byte, details)
        if details.uses_imma_ldsm:
            w = permute_rows(w, qt)
        if details.column_major:
            w = subbyte_transpose(w, qt)  # [E, N, K·bits/8]
        if details.columns_interleaved > 1:
            w = interleave_columns(w, details)
        flat = w.reshape(-1)
        if details.add_bias_and_interleave:
            flat = add_bias_and_interleave(flat, qt)
        return flat.reshape(weight.shape).contiguous()

    def invert(self, processed: torch.Tensor) -> torch.Tensor:
        details, qt = self.details, self.quant_type
        w = _as_experts(processed)
        e, k, nb = w.shape
        n = nb * qt.elements_per_byte
        check_shape(k, n, details)
        flat = w.reshape(-1)
        if details.add_bias_and_interleave:
            flat = remove_bias_and_deinterleave(flat, qt)
        kb = k * qt.bits // 8
        if details.columns_interleaved > 1:
            i = details.columns_interleaved
            w = deinterleave_columns(flat.reshape(e, n // i, i * kb), details)
        elif details.column_major:
            w = flat.reshape(e, n, kb)
        else:
            w = flat.reshape(e, k, nb)
        if details.column_major:
            w = subbyte_transpose(w, qt)  # back to [E, K, N·bits/8]
        if details.uses_imma_ldsm:
            w = unpermute_rows(w, qt)
        return w.reshape(processed.shape).contiguous()


def preprocess_weights_for_mixed_gemm(
    weight: torch.Tensor, quant_type: QuantType, arch: int, *, force_interleave: bool = False
) -> torch.Tensor:
    """TensorRT-LLM's ``preprocess_weights_for_mixed_gemm`` with the GPU's SM version given
    explicitly (upstream reads it from the current device)."""
    return CutlassMixedGemmLayout(quant_type, arch, force_interleave).apply(weight)


def unpreprocess_weights_for_mixed_gemm(
    processed: torch.Tensor, quant_type: QuantType, arch: int, *, force_interleave: bool = False
) -> torch.Tensor:
    """The exact inverse: the row-major signed codes back."""
    return CutlassMixedGemmLayout(quant_type, arch, force_interleave).invert(processed)


def as_plugin_tensor(processed: torch.Tensor) -> torch.Tensor:
    """The bytes viewed as float16, as TensorRT-LLM's MoE plugin takes them
    (``preprocessor(weight, torch.int8, torch.float16).view(torch.float16)``)."""
    return processed.view(torch.float16)
