"""``hopper_wgmma``: GPTQ (4/8-bit), AWQ (4-bit) and TurboQuant linears on Hopper (sm_90), written in
Gluon — TMA streams the prepared weight and x through a shared-memory ring, the weight is
dequantized into wgmma's register operand, and the multiplies run asynchronously while
the next block is dequantized (README.md).

Importing this plugin does not import triton: the kernel loads on the first call.
"""

from quantcore.registry import hookimpl

from .kernel import HopperWgmmaAWQ, HopperWgmmaGPTQ
from .turboquant import HopperWgmmaTurboQuant


@hookimpl
def quantcore_kernels() -> list[type]:
    return [HopperWgmmaGPTQ, HopperWgmmaAWQ, HopperWgmmaTurboQuant]


__all__ = ["HopperWgmmaAWQ", "HopperWgmmaGPTQ", "HopperWgmmaTurboQuant"]
