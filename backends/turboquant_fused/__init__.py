"""What the fused TurboQuant backends share (not a plugin itself): the kernel base whose
pass is the input rotation then one fused launch (:mod:`.base`). The plugins are
``turboquant_triton`` and ``turboquant_cutile``. Nothing here imports triton or cuda.tile."""

from .base import FusedTurboQuantKernel

__all__ = ["FusedTurboQuantKernel"]
