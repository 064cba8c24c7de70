"""``aten_cpu``: GPTQ int4 linear through torch's CPU int4pack kernels."""

from quantcore.kernels.compressed_tensors import via_gptq
from quantcore.registry import hookimpl

from .kernel import AtenCpuGPTQ


@hookimpl
def quantcore_kernels() -> list[type]:
    return [AtenCpuGPTQ, via_gptq(AtenCpuGPTQ)]
