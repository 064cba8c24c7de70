"""TurboQuant → this backend's layout, and back, losslessly: a layer's passes as one 4-bit
code matrix into the layer's codebook (:class:`~.layout.LookupWeights`, the kernels'
``LOOKUP`` operand, ``ŵ = codebook[q]·scale``).

Each pass's rotation moves to the activation (``quantcore/kernels/turboquant/rotation.py``:
one GEMM rotates x for every pass into ``x_rot [M, G, P, d]``), so the weight side of pass p
is its codes and float32 scales ``norms/√d`` alone. Group g of pass p goes to columns
``(g·P + p)·d`` of a code matrix ``[N, P·K]``, its scales likewise: the order that GEMM
writes, so one launch multiplies every pass with no copy of x, and its float32 accumulator
sums the passes before the output is rounded once. The codes take GPTQ's row form on the
way (``transforms/gptq_rows.py``, zero point 8 everywhere, which the layout drops) and that
form's layout (``layout.py``).

=============  ==============================  ===========================================
qweight        int32 [N/64, blocks·1024]       the codes of every pass, as ``layout.py``
scales         float32 [P·G, Np]               one row per (group, pass), ``norms/√d``
codebook       float32 [16]                    the centroids, zero past ``2^bits`` (and
                                               the dtype they were stored in)
rotations      P × float32 [R, d, d]           ``P_g = Π_gᵀ`` of each pass, as stored
post_bias      [N] | None, as stored           added after the launch (the kernels read
                                               the codebook where they would read a bias)
=============  ==============================  ===========================================

The rotations stay in float32 (the format's precision, so the inverse is exact); a call
casts them to the activation dtype once per layer (``turboquant_launch.py``). Groups of 128
only: the codes' block (128 inputs at 4 bits) is then one group of one pass, one scale row.
float16 or bfloat16 norms only: ``norms/√d`` in float32 gives those back bit for bit, float32
ones within a rounding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from quantcore.errors import UnsupportedProblemError
from quantcore.formats.turboquant import TurboQuant
from quantcore.kernels.turboquant.base import pad_codebook, pass_tensors
from quantcore.transform import Transform
from quantcore.transforms.gptq_rows import GPTQRows
from quantcore.transforms.turboquant_passes import PassData, TurboQuantPassTransform

from .layout import HopperWeights, LookupWeights, hopper_to_rows, rows_to_hopper

__all__ = ["GROUP_SIZE", "TurboQuantHopperWeights", "TurboQuantToHopper", "layout_refusal", "passes_to_lookup"]

#: The one group size laid out (module docstring).
GROUP_SIZE = 128
#: The zero point of the codes' GPTQ row form: ``2^(4−1)``, which the layout drops.
_MID = 8


def layout_refusal(fmt: TurboQuant) -> str | None:
    """Why ``fmt`` cannot be laid out losslessly here, or None."""
    if fmt.group_size != GROUP_SIZE:
        return (f"group_size={fmt.group_size}: hopper_wgmma lays TurboQuant out in groups of {GROUP_SIZE} "
                "(one group of one pass a block of codes)")
    if fmt.norm_dtype == torch.float32:
        return ("norm_dtype=float32: hopper_wgmma keeps each scale norms/√d in float32, which gives float32 norms "
                "back within a rounding only (float16 and bfloat16 norms come back exactly)")
    return None


def _fields(state: HopperWeights, cls: type[HopperWeights]) -> dict[str, Any]:
    """``state``'s values of the layout fields of ``cls`` (launch-time state left out)."""
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(cls) if f.name != "runtime"}


def passes_to_lookup(datas: Sequence[PassData], codebook: torch.Tensor, group_size: int) -> LookupWeights:
    """The codes and scales of a layer's passes as one code matrix into ``codebook`` (float32
    ``[16]``; module docstring); the rotations are the caller's."""
    n, k = datas[0].indices.shape[0], 2 * datas[0].indices.shape[1]
    p, d = len(datas), group_size
    groups = k // d
    device = datas[0].indices.device
    codes = torch.stack([torch.stack((data.indices & 15, data.indices >> 4), -1).reshape(n, groups, d)
                         for data in datas], 2).reshape(n, p * k).to(torch.int32)
    scales = torch.stack([data.scales for data in datas], 2).reshape(n, p * groups)
    rows = GPTQRows(codes=codes, zeros=torch.full((p * groups, n), _MID, dtype=torch.int32, device=device),
                    scales=scales.t().contiguous(), sorted_groups=torch.arange(p * k, device=device) // d,
                    ret_idx=None)
    return LookupWeights(**_fields(rows_to_hopper(rows, 4), HopperWeights), codebook=codebook)


@dataclass(kw_only=True)
class TurboQuantHopperWeights(LookupWeights):
    """A TurboQuant layer in this backend's layout (module docstring). ``in_features`` is
    the code matrix's depth, ``passes`` times the layer's."""

    rotations: tuple[torch.Tensor, ...]
    post_bias: torch.Tensor | None
    codebook_dtype: torch.dtype
    group_size: int
    passes: int

    @property
    def layer_in_features(self) -> int:
        """K of the layer (of x)."""
        return self.in_features // self.passes


class TurboQuantToHopper(Transform[Mapping[str, torch.Tensor], TurboQuantHopperWeights]):
    name = "turboquant->hopper_wgmma"

    def __init__(self, fmt: TurboQuant) -> None:
        self.fmt = fmt
        self.passes = TurboQuantPassTransform(fmt, split_halves=False)

    def apply(self, src: Mapping[str, torch.Tensor]) -> TurboQuantHopperWeights:
        fmt = self.fmt
        refused = layout_refusal(fmt)
        if refused:
            raise UnsupportedProblemError(refused)
        fmt.validate(src)
        datas = [self.passes.apply(pass_tensors(src, prefix)) for prefix in fmt.passes]
        laid = passes_to_lookup(datas, pad_codebook(src["codebook"]), fmt.group_size)
        bias = src.get("bias")
        return TurboQuantHopperWeights(
            **_fields(laid, LookupWeights),
            rotations=tuple(data.rotation for data in datas),
            post_bias=None if bias is None else bias.contiguous(),
            codebook_dtype=src["codebook"].dtype,
            group_size=fmt.group_size,
            passes=len(datas),
        )

    def invert(self, dst: TurboQuantHopperWeights) -> dict[str, torch.Tensor]:
        fmt = self.fmt
        rows = hopper_to_rows(dst)
        n, k, p, d = dst.out_features, dst.layer_in_features, dst.passes, dst.group_size
        groups = k // d
        codes = rows.codes.view(n, groups, p, d)
        scales = rows.scales.t().reshape(n, groups, p)
        out: dict[str, torch.Tensor] = {}
        for i, prefix in enumerate(fmt.passes):
            pairs = codes[:, :, i].reshape(n, k // 2, 2)
            data = PassData(indices=(pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8).contiguous(),
                            scales=scales[:, :, i].contiguous(), rotation=dst.rotations[i])
            out.update({prefix + name: t for name, t in self.passes.invert(data).items()})
        out["codebook"] = dst.codebook[: fmt.levels].to(dst.codebook_dtype)
        if dst.post_bias is not None:
            out["bias"] = dst.post_bias
        return out
