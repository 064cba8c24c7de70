"""Which preprocessing steps an architecture gets: TensorRT-LLM's ``LayoutDetails``.

Read from ``getLayoutDetailsForTransform`` (cutlass_preprocessors.cpp) and
``LayoutDetailsB`` (cutlass_extensions/gemm/kernel/mixed_gemm_B_layout.h), in the
version where the latter is templated on the activation type:

==========  ===================================  ======  ==========  ===========  =====
arch        B layout                             LDSM    tile rows   interleave   bias
==========  ===================================  ======  ==========  ===========  =====
70–74       ColumnMajor                          no      1           1            yes
75–89       ColumnMajorTileInterleave<TbK, CI>   yes     TbK         CI           yes
90          ColumnMajor                          no      1           1            no
==========  ===================================  ======  ==========  ===========  =====

with ``TbK = 128 · 8 / activation_bits`` (64 for fp16/bf16 activations, 128 for fp8) and
``CI = (128 · 8 / weight_bits) / TbK`` (int8: 2, int4: 4, int4 with fp8: 2). "bias" is
step 4, the +128 / +8 bias and register interleave, run for ``70 <= arch < 90``.

``force_interleave`` (the MoE loaders pass it, since MoE has no specialised Hopper
kernel) turns arch 90 into 80 before anything else: MoE weights on an H100 get the
sm80 layout. Other architectures are refused, as the preprocessor followed here does.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantcore.errors import UnsupportedProblemError

from .quant_type import QuantType

__all__ = ["LayoutDetails", "effective_arch", "layout_details"]


@dataclass(frozen=True)
class LayoutDetails:
    arch: int
    quant_type: QuantType
    column_major: bool
    uses_imma_ldsm: bool
    rows_per_column_tile: int
    columns_interleaved: int
    add_bias_and_interleave: bool


def effective_arch(arch: int, force_interleave: bool) -> int:
    """``preprocess_weights_for_mixed_gemm``: ``if (force_interleave && arch == 90) arch = 80``."""
    return 80 if force_interleave and arch == 90 else arch


def layout_details(quant_type: QuantType, arch: int) -> LayoutDetails:
    """The steps for ``arch`` (already passed through :func:`effective_arch`)."""
    bias = 70 <= arch < 90
    if 75 <= arch < 90:
        threadblock_k = 128 * 8 // quant_type.activation_bits
        interleave = (128 * 8 // quant_type.bits) // threadblock_k
        return LayoutDetails(arch, quant_type, True, True, threadblock_k, interleave, bias)
    if 70 <= arch < 75 or arch == 90:
        return LayoutDetails(arch, quant_type, True, False, 1, 1, bias)
    raise UnsupportedProblemError(
        f"arch: TensorRT-LLM's mixed-GEMM preprocessor lays out weights for SM 70–90, got SM {arch}"
    )
