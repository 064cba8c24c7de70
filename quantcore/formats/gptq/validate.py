"""GPTQ tensor validation: every message names the tensor, the expectation and what came."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from ...errors import TensorFormatError
from ...tensors import describe, reject_unknown, require_tensor, require_tensors
from ..grouping import SCALE_DTYPES, check_linear_extras

if TYPE_CHECKING:
    from .format import GPTQ

__all__ = ["SCALE_DTYPES", "TENSOR_NAMES", "validate_gptq"]

TENSOR_NAMES = ("qweight", "qzeros", "scales", "g_idx", "bias")


def validate_gptq(fmt: GPTQ, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
    where = f"{fmt.slug} tensors"
    reject_unknown(
        tensors, TENSOR_NAMES, where=where,
        takes=f"gptq takes {', '.join(TENSOR_NAMES)} (g_idx and bias optional)",
    )
    require_tensors(tensors, ("qweight", "qzeros", "scales"), where=where)
    geo = fmt.geometry
    lanes = f"{geo.lanes} lane(s) per {geo.codes} codes" if geo.lanes > 1 else f"{geo.codes} codes per lane"
    qweight = require_tensor("qweight", tensors["qweight"], dtypes=(fmt.pack_dtype,), where=where)
    scales = require_tensor("scales", tensors["scales"], dtypes=SCALE_DTYPES, where=where)
    if qweight.dim() != 2:
        raise TensorFormatError(f"{where}: qweight: expected 2-D [I·{fmt.bits}/{geo.width}, O], got {describe(qweight)}")
    if scales.dim() != 2:
        raise TensorFormatError(f"{where}: scales: expected 2-D [G, O], got {describe(scales)}")
    in_features, out_features = fmt.in_features_of(qweight), qweight.shape[1]
    if in_features == 0 or out_features == 0:
        raise TensorFormatError(f"{where}: qweight: expected non-empty, got {describe(qweight)}")
    if out_features % geo.codes:
        raise TensorFormatError(
            f"{where}: out_features = {out_features} (qweight.shape[1]) must be a multiple of "
            f"{geo.codes} to pack qzeros ({lanes})"
        )
    groups = fmt.num_groups(in_features)
    require_tensor("scales", scales, shape=(groups, out_features), where=where)
    require_tensor(
        "qzeros", tensors["qzeros"], shape=(groups, out_features // geo.codes * geo.lanes),
        dtypes=(fmt.pack_dtype,), where=where,
    )
    g_idx = tensors.get("g_idx")
    if g_idx is not None:
        _check_g_idx(fmt, g_idx, in_features, groups, where)
    check_linear_extras(tensors, out_features, where)
    return {"K": in_features, "N": out_features}


def _check_g_idx(fmt: GPTQ, g_idx: torch.Tensor, in_features: int, groups: int, where: str) -> None:
    require_tensor("g_idx", g_idx, shape=(in_features,), dtypes=(torch.int32, torch.int64), where=where)
    lo, hi = int(g_idx.min()), int(g_idx.max())
    if lo < 0 or hi >= groups:
        raise TensorFormatError(
            f"{where}: g_idx: expected values in [0, {groups}) for group_size="
            f"{fmt.group_size} over {in_features} inputs, got range [{lo}, {hi}]"
        )
    if fmt.uses_act_order:
        return
    # Without act-order (or with static groups) GPTQ writes g_idx = i // group_size; any
    # other g_idx means the config and the tensors disagree.
    gs = fmt.effective_group_size(in_features)
    expected = torch.arange(in_features, device=g_idx.device) // gs
    if not torch.equal(g_idx.to(torch.int64), expected):
        bad = int(torch.nonzero(g_idx.to(torch.int64) != expected)[0])
        why = "static_groups=True" if fmt.static_groups else "desc_act=False"
        raise TensorFormatError(
            f"{where}: g_idx: {why} expects g_idx[i] = i // {gs}, but g_idx[{bad}] = "
            f"{int(g_idx[bad])} (an act-order checkpoint needs desc_act=True)"
        )
