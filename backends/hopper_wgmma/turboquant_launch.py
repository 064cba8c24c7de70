"""A call of a TurboQuant layer in this backend's layout: x rotated by every pass in one
bound launch (``quantcore/kernels/turboquant/rotation_launch.py``), then one launch over the
code matrix (``launch.linear``: the decode kernel up to 8 rows, the wgmma kernel above, both
with the codebook operand; ``configs.lookup_plan``), then the bias.

An eager call with little rotation work and a small weight (:func:`rotates_in_launch`)
rotates x in the code matrix's launch instead (``rotation_programs.py``): one launch, not
two, which saves the host a launch. On an H200
(``benchmarks/results/probes/turboquant_hopper_rotation-nvidia-h200.json``, ``-wgmma-``) such
a call costs the host 0.98–1.38× ``nn.Linear``'s, against 1.4–1.9× with two launches. A call
being captured into a CUDA graph keeps the two launches: there the host cost is gone, and
the one launch took the GPU 3–8 µs longer (its code-matrix programs wait for the rotation
programs' stores with only their first weight stages in flight; 27.0 against 22.8 µs at
4096×14336, M = 1). Both give the same bits: the rotation programs run the rotation's
launch's MMAs (``mma.sync`` m16n8k16, float32, the same order of inputs; 54 cases of 54
equal, M = 1 to 128, and the GPU tests hold them to it).
Imports triton.
"""

from __future__ import annotations

from typing import Any

import torch

from quantcore.kernels.turboquant.rotation import InputRotation
from quantcore.kernels.turboquant.rotation_launch import RotationLaunch
from quantcore.tensors import version_of
from quantcore.triton.launch import launch_state

from .decode_bucket import DecodeBucket
from .launch import AnyBucket, WgmmaBucket, bucket_of, pdl_mode
from .rotation_programs import Rotation, rotation_chunks
from .turboquant_layout import TurboQuantHopperWeights

__all__ = ["ROTATION_DIRECT_LOADS", "ROTATION_IN_LAUNCH", "layer_rotation", "rotates_in_launch", "turboquant_linear"]

#: Which calls rotate x in the code matrix's launch: eager ones within the bounds below
#: (``"eager"``, the default), ``"always"`` (captures too, whatever the bounds) or ``"never"``:
#: the switch a probe times both ways with.
ROTATION_IN_LAUNCH = "eager"
#: Whether a rotating bucket bound from now on loads its operands straight into registers
#: (``rotation_programs.rotate_chunk``'s ``DIRECT``: 56 registers against 80 in the decode
#: kernel, one barrier against 132 in its rotation programs, compiled for sm_90a). Off: the
#: measurements above are the other way's, and this one's GPU time is not yet measured; a
#: probe sets it to time both (``tools/probes/turboquant_hopper_rotation.py --direct``).
ROTATION_DIRECT_LOADS = False
#: An eager call takes the rotation into its launch only where its rotation work and its
#: weight are small, as here: at most this many (16-row chunk, code-matrix block) pairs
#: (twice as many for a code matrix of at most :data:`ROTATION_SMALL_CODES`) ...
ROTATION_MAX_BLOCKS = 128
ROTATION_SMALL_CODES = 1 << 25
#: ... and a code matrix of at most this many codes (64 MiB). On an H200 the one launch took
#: the GPU 3–8 µs longer than the two wherever it stayed within these bounds (every case
#: measured: ``benchmarks/results/probes/turboquant_hopper_rotation-*-nvidia-h200.json``),
#: while it saves the host 10–20 µs; an eager call waits on the slower of the two, so it wins
#: where the GPU's time stays near the host's (4096×4096 at M = 128: the host 43.6 against
#: 62.2 µs, the GPU 27.6 against 22.3). Past them the GPU's time grows (each output program
#: waits for every chunk, and each chunk reads its group's rotation again: 14336×4096 at
#: M = 128 took 77 against 52 µs; 4096×14336 with two passes at M = 64, 63.0 against 59.4
#: beside a host's 58.5), and the two launches stay.
ROTATION_MAX_CODES = 1 << 27


def rotates_in_launch(m: int, w: TurboQuantHopperWeights) -> bool:
    """Whether an eager call of ``m`` rows takes the rotation into its launch (the bounds above)."""
    k = w.in_features
    codes = w.out_features * k
    blocks = ROTATION_MAX_BLOCKS * (2 if codes <= ROTATION_SMALL_CODES else 1)
    return rotation_chunks(m, k // 128) <= blocks and codes <= ROTATION_MAX_CODES


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
    rotation = layer_rotation(w, x.dtype, x.device)
    m = x2.shape[0]
    bucket = bucket_of(x2, w, m)
    mode = ROTATION_IN_LAUNCH
    fused = mode == "always" or (mode == "eager" and not capturing(x) and rotates_in_launch(m, w))
    twin = _rotating(bucket, w, rotation) if fused else None
    y = twin.rotating(x2, m) if twin is not None else bucket(rotation.rows(x2), w, m)
    if w.post_bias is not None:
        y.add_(w.post_bias)  # summed in float32, rounded once more to the activation dtype
    return y if flat else y.view(*x.shape[:-1], w.out_features)


def capturing(x: torch.Tensor) -> bool:
    """Whether the call is being captured into a CUDA graph (which keeps two launches)."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _rotating(bucket: AnyBucket, w: TurboQuantHopperWeights,
              rotation: RotationLaunch) -> DecodeBucket | WgmmaBucket | None:
    """The twin of ``bucket`` that rotates x in its launch, made on the bucket's first call
    (again for a layer whose rotations were replaced), or None where there is none."""
    if not isinstance(bucket, DecodeBucket | WgmmaBucket):
        return None
    twin = bucket.rotated
    if twin is None or (isinstance(twin, DecodeBucket | WgmmaBucket) and twin.rhs is not rotation.rhs):
        twin = bucket.rotated = _rotating_twin(bucket, w, rotation)
    return twin if isinstance(twin, DecodeBucket | WgmmaBucket) else None


def _rotating_twin(bucket: DecodeBucket | WgmmaBucket, w: TurboQuantHopperWeights,
                   rotation: RotationLaunch) -> DecodeBucket | WgmmaBucket | bool:
    """``bucket``'s plan with the rotation in its launch, or False where the rotation
    programs cannot run it: a 16-bit activation, groups of 128, one or two passes, and no
    programmatic dependent launch (the wgmma kernel's)."""
    rot = rotation.rotation
    if bucket.dtype not in (torch.bfloat16, torch.float16) or rot.d != 128 or rot.copies not in (1, 2):
        return False
    if isinstance(bucket, WgmmaBucket) and pdl_mode():
        return False
    operand = Rotation.of(rotation.rhs, rot.d, rot.copies, rot.shared, ROTATION_DIRECT_LOADS)
    return type(bucket)(w, bucket.dtype, bucket.device, bucket.plan, rotation=operand)
