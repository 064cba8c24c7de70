"""``aten_cuda``: GPTQ and AWQ int4 linears on NVIDIA GPUs through torch's own tinygemm
(``aten._convert_weight_to_int4pack`` / ``aten._weight_int4pack_mm``)."""

from quantcore.kernels.compressed_tensors import via_gptq
from quantcore.registry import hookimpl

from .kernel import AtenCudaAWQ, AtenCudaGPTQ


@hookimpl
def quantcore_kernels() -> list[type]:
    return [AtenCudaGPTQ, AtenCudaAWQ, via_gptq(AtenCudaGPTQ)]
