"""What every trtllm_moe kernel shares: the format check, the activation dtypes and the
check that a call got the prepared state its own ``prepare`` made."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ...errors import KernelInputError
from ...formats.trtllm_moe import TRTLLMMoE
from ...kernel import Support
from ...ops.moe import MoEKernel
from ...problem import Problem

__all__ = ["ACT_DTYPES", "TRTLLMMoEKernel"]

#: Activation dtypes the format is used with (its scales are stored in one of them).
ACT_DTYPES = (torch.float16, torch.bfloat16)


class TRTLLMMoEKernel(MoEKernel):
    format: ClassVar[str] = "trtllm_moe"
    #: The class ``prepare`` returns; ``__call__`` refuses anything else.
    prepared_type: ClassVar[type]

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        if not isinstance(problem.format, TRTLLMMoE):
            return Support.no(f"format {problem.format.slug} is not trtllm_moe")
        if problem.act_dtype not in ACT_DTYPES:
            return Support.no(f"activation dtype {problem.act_dtype}: expected float16 or bfloat16")
        return Support.yes()

    def require_prepared(self, prepared: Any) -> None:
        if type(prepared) is not self.prepared_type:
            raise KernelInputError(
                f"prepared: expected the {self.prepared_type.__name__} that {self.name}.prepare returns, "
                f"got {type(prepared).__name__}"
            )
