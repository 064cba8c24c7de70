"""What the ``act_quant_lora`` backends share: the prepared state and checks
(:mod:`.base`), the one Triton source (:mod:`.triton_source`) and its launcher
(:mod:`.triton_kernel`). The plugins are thin: ``triton_nvfp4``, ``triton_ascend_int4``
and ``svdquant_torch`` (see README.md here). Nothing here imports triton at import time."""

from .base import SVDQuantKernel, SVDQuantWeights, allocate_outputs

__all__ = ["SVDQuantKernel", "SVDQuantWeights", "allocate_outputs"]
