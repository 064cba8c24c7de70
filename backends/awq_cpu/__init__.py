"""``awq_cpu``: AWQ int4 linear through torch's CPU int4pack kernels (as GPTQModel's
``TorchFusedAwqQuantLinear``). Where those ops are missing, the registry picks the dense
AWQ path (``torch_fallback``), and ``explain`` says why."""

from quantcore.registry import hookimpl

from .kernel import AwqCpu


@hookimpl
def quantcore_kernels() -> list[type]:
    return [AwqCpu]
