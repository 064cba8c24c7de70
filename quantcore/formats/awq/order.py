"""AWQ's nibble order: within each int32 lane of 8 outputs, nibble ``i`` (bits
``4i .. 4i+3``) holds output column ``AWQ_ORDER[i]`` of that lane's 8 columns.

AutoAWQ packs ``qweight[:, c] |= intweight[:, 8c + AWQ_ORDER[i]] << 4i`` with
``AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]`` (even columns in the low half of the lane,
odd columns in the high half: what its GEMM kernel's dequantizer wants), and undoes it
with ``AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]`` (column k lives in nibble
``AWQ_REVERSE_ORDER[k]``). qweight and qzeros use the same order.
"""

from __future__ import annotations

import torch

from ..packing import pack_codes, unpack_codes

__all__ = ["AWQ_ORDER", "AWQ_REVERSE_ORDER", "pack_awq", "unpack_awq"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
_LANE = 8


def _lane_permutation(columns: int, order: tuple[int, ...], device: torch.device) -> torch.Tensor:
    base = torch.arange(0, columns, _LANE, device=device).unsqueeze(1)
    return (base + torch.tensor(order, device=device)).reshape(-1)


def pack_awq(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes ``[R, O]`` → int32 lanes ``[R, O/8]`` in AWQ order."""
    if codes.shape[-1] % _LANE:
        raise ValueError(f"codes: last dim {codes.shape[-1]} is not a multiple of {_LANE}")
    shuffled = codes.index_select(-1, _lane_permutation(codes.shape[-1], AWQ_ORDER, codes.device))
    return pack_codes(shuffled, 4, dim=-1, lane_dtype=torch.int32)


def unpack_awq(lanes: torch.Tensor) -> torch.Tensor:
    """int32 lanes ``[R, O/8]`` in AWQ order → codes ``[R, O]`` int32, columns in order."""
    shuffled = unpack_codes(lanes, 4, dim=-1)
    return shuffled.index_select(-1, _lane_permutation(shuffled.shape[-1], AWQ_REVERSE_ORDER, lanes.device))
