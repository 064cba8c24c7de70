"""GPTQ → torch's CUDA tinygemm layout (``aten._convert_weight_to_int4pack``).

The op's contract, as torchao's ``TensorCoreTiledLayout`` feeds it (torch ≥ 2.5) and as
measured on an H100 (docs/aten-int4pack.md):

* convert input: uint8 ``[N, K/2]``, two codes per byte with the **even** input in the
  **high** nibble (``q[:, 0::2] << 4 | q[:, 1::2]``) — the opposite of the CPU and XPU
  ops; output: an opaque int32 ``[N/8, K/(innerKTiles·16), 32, innerKTiles/2]`` tiling;
* mm: ``y = x · wᵀ`` with ``w[n, k] = (q[n, k] − 8) · s[g, n] + offset[g, n]``,
  ``g = k // groupSize``, ``scales_and_zeros [K/groupSize, N, 2]`` in x's dtype (bf16);
* groupSize ∈ {32, 64, 128, 256}; innerKTiles ∈ {2, 4, 8} with K % (innerKTiles·16) == 0.

Measured on an H100 (torch 2.11, ``python -m tools.probes.tinygemm_contract``; log in
benchmarks/results/nvidia-h100-80gb-hbm3/tinygemm-contract-gpu-run.log): with even-high
bytes ``(q − 8)·s + z`` matches to 2.4e-3 (bf16) for innerKTiles 2, 4 and 8, while
even-low bytes — the CPU op's order — give errors ≈ 1.2 under every formula;
fp16 and fp32 activations are refused (``A.dtype() == kBFloat16``), groups of 16 or 512
are refused, N = 24 or 40 and K = 64 or 96 (with a fitting innerKTiles) are accepted.

Zero points become offsets exactly as for the CPU op (``gptq_rows.scales_and_offsets``);
groups the op lacks (−1, act-order) are split into accepted sub-groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from quantcore.errors import UnsupportedProblemError
from quantcore.formats.gptq import GPTQ
from quantcore.transform import Transform
from quantcore.transforms.gptq_rows import GPTQToRows, scales_and_offsets
from quantcore.transforms.packed import PackedLinear

__all__ = ["CODE_BIAS", "N_ALIGN", "OP_GROUP_SIZES", "GPTQToTinygemm", "Int4PackCUDA", "inner_k_tiles", "tinygemm_bytes"]

OP_GROUP_SIZES = (32, 64, 128, 256)
INNER_K_TILES = (8, 4, 2)
#: N = 24 and 40 were accepted on the H100; tinygemm tiles N by 8.
N_ALIGN = 8
CODE_BIAS = 8


def inner_k_tiles(k: int) -> int | None:
    """The widest innerKTiles the op accepts for this K (wider tiles load more per step)."""
    return next((t for t in INNER_K_TILES if k % (t * 16) == 0), None)


def tinygemm_bytes(codes: torch.Tensor) -> torch.Tensor:
    """Codes ``[N, K]`` → uint8 ``[N, K/2]``, even input in the high nibble."""
    c = codes.to(torch.uint8)
    return ((c[:, 0::2] << 4) | c[:, 1::2]).contiguous()


@dataclass(kw_only=True)
class Int4PackCUDA(PackedLinear):
    """tinygemm's tiled int32 weight and float32 ``[K/group, N, 2]`` (scale, offset)."""

    scales_offsets: torch.Tensor
    inner_k_tiles: int
    META: ClassVar[str] = "scales_offsets"


class GPTQToTinygemm(Transform[Mapping[str, torch.Tensor], Int4PackCUDA]):
    name = "gptq->tinygemm"

    def __init__(self, fmt: GPTQ) -> None:
        if fmt.bits != 4:
            raise UnsupportedProblemError(f"bits: tinygemm takes 4-bit codes, got {fmt.bits}")
        self.fmt = fmt

    def apply(self, src: Mapping[str, torch.Tensor]) -> Int4PackCUDA:
        rows = GPTQToRows(self.fmt).apply(src)
        n, k = rows.out_features, rows.in_features
        if rows.codes.device.type != "cuda":
            # The op has no kernel elsewhere; torch would raise NotImplementedError.
            raise UnsupportedProblemError(
                f"qweight: tinygemm's layout is made by a CUDA op, got tensors on {rows.codes.device}"
            )
        tiles = inner_k_tiles(k)
        if n % N_ALIGN or tiles is None:
            raise UnsupportedProblemError(
                f"shape: tinygemm needs N % {N_ALIGN} == 0 and K % 32 == 0, got N={n}, K={k}"
            )
        grouped = scales_and_offsets(rows, OP_GROUP_SIZES, CODE_BIAS)
        if grouped is None:
            raise UnsupportedProblemError(
                f"g_idx: no group size tinygemm takes ({OP_GROUP_SIZES}) splits this checkpoint's groups"
            )
        group, scales_offsets = grouped
        weight = torch.ops.aten._convert_weight_to_int4pack(tinygemm_bytes(rows.codes), tiles)
        return Int4PackCUDA(
            weight=weight, scales_offsets=scales_offsets, group_size=group, inner_k_tiles=tiles,
            ret_idx=rows.ret_idx, bias=rows.bias, in_features=k, out_features=n,
        )
