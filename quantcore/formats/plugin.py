"""The built-in formats, contributed through the same hook a third party implements."""

from __future__ import annotations

from ..registry.hookspecs import hookimpl
from .base import Format
from .awq import AWQ
from .gptq import GPTQ


@hookimpl
def quantcore_formats() -> list[type[Format]]:
    return [GPTQ, AWQ]
