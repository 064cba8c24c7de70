"""``aten_xpu``: GPTQ int4 linear through ``aten._weight_int4pack_mm_with_scales_and_zeros``
on Intel XPUs. Registered everywhere; probing refuses it on any other device, with the
reason, so the matrix says SKIP. ``contract.py`` emulates the op in plain torch, which
is how its transform is proven on a CPU."""

from quantcore.kernels.compressed_tensors import via_gptq
from quantcore.registry import hookimpl

from .kernel import AtenXpuGPTQ


@hookimpl
def quantcore_kernels() -> list[type]:
    return [AtenXpuGPTQ, via_gptq(AtenXpuGPTQ)]
