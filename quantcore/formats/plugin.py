"""The built-in formats, contributed through the same hook a third party implements."""

from __future__ import annotations

from ..registry.hookspecs import hookimpl
from .awq import AWQ
from .base import Format
from .gptq import GPTQ
from .svdquant import SVDQuantAct
from .trtllm_moe import TRTLLMMoE
from .turboquant import TurboQuant


@hookimpl
def quantcore_formats() -> list[type[Format]]:
    return [GPTQ, AWQ, TRTLLMMoE, TurboQuant, SVDQuantAct]
