"""``turboquant_torch``: the seed's TurboQuant forward pass in plain PyTorch, anywhere."""

from quantcore.registry import hookimpl

from .kernel import TurboQuantTorch


@hookimpl
def quantcore_kernels() -> list[type]:
    return [TurboQuantTorch]


__all__ = ["TurboQuantTorch"]
