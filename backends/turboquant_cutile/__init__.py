"""``turboquant_cutile``: the fused TurboQuant kernel in cuTile (``cuda.tile``).

Importing this plugin does not import cuda.tile: the kernel module loads on first run.
"""

from quantcore.registry import hookimpl

from .kernel import TurboQuantCuTile


@hookimpl
def quantcore_kernels() -> list[type]:
    return [TurboQuantCuTile]


__all__ = ["TurboQuantCuTile"]
