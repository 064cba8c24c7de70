"""TurboQuant kernels' shared code: the pass contract every kernel implements and the
offload path relies on (:mod:`.base`), the fused kernels' base (:mod:`.fused`) and what
one call moves (:mod:`.cost`)."""

from .base import PassData, TurboQuantLinearKernel, TurboQuantPrepared
from .fused import FusedTurboQuantKernel

__all__ = ["FusedTurboQuantKernel", "PassData", "TurboQuantLinearKernel", "TurboQuantPrepared"]
