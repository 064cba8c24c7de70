"""TurboQuant at run time.

the pass-level contract every TurboQuant kernel implements
                (:class:`TurboQuantLinearKernel`, :class:`TurboQuantPrepared`) is
                :mod:`quantcore.kernels.turboquant`
``module.py``   :class:`TurboQuantLinear`, an ``nn.Linear`` replacement run through ``bind``
``model.py``    ``TurboQuantConfig``, ``quantize_model``, ``save_quantized``, ``load_quantized``
``offload.py``  pass 2 in pinned host memory, streamed in per layer (:class:`Pass2OffloadPool`)

The format and its golden math are :mod:`quantcore.formats.turboquant`.
"""

from __future__ import annotations

from ...kernels.turboquant import TurboQuantLinearKernel, TurboQuantPrepared
from .model import (
    TurboQuantConfig,
    enable_pass2_offload,
    load_quantized,
    quantize_model,
    quantized_modules,
    save_quantized,
)
from .module import TurboQuantLinear
from .offload import Pass2OffloadPool

__all__ = [
    "Pass2OffloadPool",
    "TurboQuantConfig",
    "TurboQuantLinear",
    "TurboQuantLinearKernel",
    "TurboQuantPrepared",
    "enable_pass2_offload",
    "load_quantized",
    "quantize_model",
    "quantized_modules",
    "save_quantized",
]
