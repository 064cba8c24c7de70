"""A call of a TurboQuant layer in this backend's layout: x rotated by every pass in one
bound launch (``quantcore/kernels/turboquant/rotation_launch.py``), then one launch over the
code matrix (``launch.linear``: the decode kernel up to 8 rows, the wgmma kernel above, both
with the codebook operand; ``configs.lookup_plan``), then the bias. Imports triton.
"""

from __future__ import annotations

from typing import Any

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
    tensors) and with the state object (a call on the direct route finds it there in one
    lookup); made again when the rotations are other tensors or were changed in place."""
    rotations = w.rotations
    key = ("rotation", dtype)
    kept = w.runtime.get(key)
    if kept is None or kept[0] is not rotations or kept[1] != tuple(version_of(r) for r in rotations):
        kept = w.runtime[key] = _kept_rotation(w, dtype, device)
    return kept[2]  # type: ignore[no-any-return]


def _kept_rotation(w: TurboQuantHopperWeights, dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    """``(rotations, their versions, the launch)`` from the packed codes' launch state, bound
    there on a miss."""
    state = launch_state(w.qweight)
    versions = tuple(version_of(r) for r in w.rotations)
    kept = state.get(("rotation", dtype))
    if kept is None or kept[1] != versions or any(a is not b for a, b in zip(kept[0], w.rotations, strict=True)):
        rotation = InputRotation([r.to(dtype) for r in w.rotations])
        kept = state[("rotation", dtype)] = (w.rotations, versions,
                                             RotationLaunch(rotation, w.layer_in_features, device))
    return (w.rotations, *kept[1:])


def turboquant_linear(x: torch.Tensor, w: TurboQuantHopperWeights) -> torch.Tensor:
    """``y = x · Ŵᵀ + b`` ``[..., N]`` for ``x`` ``[..., K]`` (at least one row, checked). A
    contiguous ``[M, K]`` x (a decode step's) is taken as it is and ``y`` made ``[M, N]``:
    no reshape or view a call (each costs the host about a microsecond)."""
    flat = x.dim() == 2 and x.is_contiguous()
    x2 = x if flat else x.reshape(-1, w.layer_in_features).contiguous()
    y = linear(layer_rotation(w, x.dtype, x.device).rows(x2), w)
    if w.post_bias is not None:
        y.add_(w.post_bias)  # summed in float32, rounded once more to the activation dtype
    return y if flat else y.view(*x.shape[:-1], w.out_features)
