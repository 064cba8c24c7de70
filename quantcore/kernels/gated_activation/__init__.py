"""The gated activation of a fused gate/up layer: ``act(h[..., :I]) · h[..., I:]``.

:func:`gated_activation` takes ``h = [..., 2·I]`` as a fused gate/up layer writes it (gate
first, then up) and returns ``[..., I]``; :data:`ACTIVATIONS` is the one table of the
activations it (and the MLP blocks built on it) take. On CUDA it is one Triton launch for
silu and relu (:data:`KERNEL_ACTIVATIONS`)
(:mod:`.triton_source`, bound by :mod:`.triton_launch`); elsewhere, while traced, or where
Triton cannot run, torch's own ops. Nothing here imports triton until the kernel first
runs.
"""

from __future__ import annotations

from .op import (
    ACTIVATIONS,
    KERNEL_ACTIVATIONS,
    KERNEL_DTYPES,
    check_gated,
    gated_activation,
    why_torch,
)

__all__ = ["ACTIVATIONS", "KERNEL_ACTIVATIONS", "KERNEL_DTYPES", "check_gated", "gated_activation", "why_torch"]
