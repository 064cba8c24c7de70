"""The built-in conformance cases, contributed through the ``quantcore_conformance_cases``
hook like a third party's, from their own entry-point group (``quantcore.conformance``):
the registry loads them when the matrix asks for cases, so choosing a kernel never
imports them. One module per format; the ``ci`` profile keeps CPU time bounded, ``full``
is what a device lane runs."""

from __future__ import annotations

from quantcore.registry import hookimpl

from ..case import Case
from .awq import awq_cases
from .compressed_tensors import compressed_tensors_cases
from .gptq import gptq_cases
from .svdquant import svdquant_cases
from .trtllm_moe import trtllm_moe_cases
from .turboquant import turboquant_cases

__all__ = ["awq_cases", "compressed_tensors_cases", "gptq_cases", "svdquant_cases", "trtllm_moe_cases", "turboquant_cases"]


@hookimpl
def quantcore_conformance_cases() -> list[Case]:
    return [*gptq_cases(), *awq_cases(), *trtllm_moe_cases(), *turboquant_cases(), *svdquant_cases(),
            *compressed_tensors_cases()]
