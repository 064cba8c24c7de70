"""A third-party quantcore plugin: its hooks are plain functions marked ``@hookimpl``."""

from quantcore.registry import hookimpl

from .kernel import ZeroFoldingGPTQ


@hookimpl
def quantcore_kernels() -> list[type]:
    return [ZeroFoldingGPTQ]
