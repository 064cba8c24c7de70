"""``turboquant_triton``: the fused TurboQuant kernel in Triton (CUDA; the interpreter on CPU).

Importing this plugin does not import triton: the kernel module loads on first run.
"""

from quantcore.registry import hookimpl

from .kernel import TurboQuantTriton


@hookimpl
def quantcore_kernels() -> list[type]:
    return [TurboQuantTriton]


__all__ = ["TurboQuantTriton"]
