"""A call of a TurboQuant layer in this backend's layout: x rotated by every pass in one
bound launch (``quantcore/kernels/turboquant/rotation_launch.py``), then one launch over the
code matrix (``launch.linear``: the decode kernel up to 8 rows, the wgmma kernel above, both
with the codebook operand; ``configs.lookup_plan``), then the bias. Imports triton.
"""

from __future__ import annotations

import torch

from quantcore.kernels.turboquant.rotation import InputRotation
from quantcore.kernels.turboquant.rotation_launch import RotationLaunch
from quantcore.tensors import version_of
from quantcore.triton.launch import launch_state

from .launch import linear
from .turboquant_layout import TurboQuantHopperWeights

__all__ = ["layer_rotation", "turboquant_linear"]


def layer_rotation(w: TurboQuantHopperWeights, dtype: torch.dtype, device: torch.device) -> RotationLaunch:
    """The layer's rotation in ``dtype`` as a bound launch, made on the first call and kept
    with the packed codes (the custom op rebuilds the state object at every call, not its
    tensors); made again when the rotations are other tensors or were changed in place."""
    state = launch_state(w.qweight)
    versions = [version_of(r) for r in w.rotations]
    kept = state.get(("rotation", dtype))
    if kept is None or kept[1] != versions or any(a is not b for a, b in zip(kept[0], w.rotations, strict=True)):
        rotation = InputRotation([r.to(dtype) for r in w.rotations])
        kept = state[("rotation", dtype)] = (w.rotations, versions,
                                             RotationLaunch(rotation, w.layer_in_features, device))
    return kept[2]  # type: ignore[no-any-return]


def turboquant_linear(x: torch.Tensor, w: TurboQuantHopperWeights) -> torch.Tensor:
    """``y = x · Ŵᵀ + b`` ``[..., N]`` for ``x`` ``[..., K]`` (at least one row, checked)."""
    k = w.layer_in_features
    m = x.numel() // k
    x_rot = layer_rotation(w, x.dtype, x.device)(x.reshape(m, k).contiguous()).view(m, w.in_features)
    y = linear(x_rot, w)
    if w.post_bias is not None:
        y.add_(w.post_bias)  # summed in float32, rounded once more to the activation dtype
    return y.view(*x.shape[:-1], w.out_features)
