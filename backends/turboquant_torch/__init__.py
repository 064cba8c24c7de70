"""``turboquant_torch``: the TurboQuant forward pass (docs/formats/turboquant.md) in plain PyTorch, anywhere."""

from quantcore.registry import hookimpl

from .kernel import TurboQuantTorch


@hookimpl
def quantcore_kernels() -> list[type]:
    return [TurboQuantTorch]


__all__ = ["TurboQuantTorch"]
