"""The base of ``act_quant_lora`` kernels and the check of their activation."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import torch

from ...errors import KernelInputError
from ...kernel import Kernel
from ...tensors import describe
from .reference import ActQuantLoraOutput

__all__ = ["ACT_DTYPES", "ActQuantLoraKernel", "check_activation"]

ACT_DTYPES = (torch.float16, torch.bfloat16)


def check_activation(x: object, *, n: int, dtype: torch.dtype, device: torch.device) -> int:
    """``x`` must be ``[M, N]`` in the dtype the kernel was prepared for, on its device;
    returns M."""
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    shape = x.shape
    if len(shape) != 2 or shape[1] != n or x.dtype != dtype or x.device != device:
        name = str(dtype).removeprefix("torch.")
        raise KernelInputError(f"x: expected [M, {n}] {name} on {device}, got {describe(x)}")
    return int(shape[0])


class ActQuantLoraKernel(Kernel):
    """Runs ``act_quant_lora`` for the ``svdquant`` format; the contract is in
    :mod:`quantcore.ops.act_quant_lora`."""

    op: ClassVar[str] = "act_quant_lora"

    @abstractmethod
    def __call__(self, x: torch.Tensor, prepared: Any) -> ActQuantLoraOutput: ...
