"""The built-in formats, contributed through the same hook a third party implements."""

from __future__ import annotations

from ..formats.awq import AWQ
from ..formats.base import Format
from ..formats.compressed_tensors import CompressedTensors
from ..formats.gptq import GPTQ
from ..formats.svdquant import SVDQuantAct
from ..formats.trtllm_moe import TRTLLMMoE
from ..formats.turboquant import TurboQuant
from .hookspecs import hookimpl


@hookimpl
def quantcore_formats() -> list[type[Format]]:
    return [GPTQ, AWQ, TRTLLMMoE, TurboQuant, SVDQuantAct, CompressedTensors]
