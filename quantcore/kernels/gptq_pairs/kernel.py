"""The GPTQ (4/8-bit) and AWQ (4-bit, through GPTQ lanes) linear kernels over
pair-interleaved codes (:mod:`.layout`): what ``triton_int4`` and ``hopper_wgmma`` share.

:class:`PairedGPTQKernel` checks the bits and the activation dtype, prepares (the stored
tensors moved to the device, then the backend's transform) and calls (the activation
checked, made contiguous or permuted by ``ret_idx``, handed to the backend's launcher
in its own shape). A backend names its transform, its prepared state, its launcher and its own
limits (:meth:`~PairedGPTQKernel.layout_supports`); :class:`AWQViaGPTQLanes`, put before
the backend's GPTQ kernel among a class's bases, makes the AWQ kernel of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from ...cost import grouped_weight_bytes
from ...dtypes import dtype_name
from ...errors import KernelInputError
from ...formats.awq import AWQ
from ...formats.gptq import GPTQ
from ...kernel import LinearKernel, Support
from ...problem import Problem
from ...tensors import stored_on
from ...transform import Transform
from ...transforms.awq_gptq import AWQToGPTQ, gptq_format_for
from ...triton.checks import check_x
from .layout import SUPPORTED_BITS
from .weights import PairedWeights

__all__ = ["ACT_DTYPES", "AWQViaGPTQLanes", "PairedGPTQKernel", "code_bits", "weight_bytes"]

ACT_DTYPES = (torch.bfloat16, torch.float16)

Tensors = Mapping[str, torch.Tensor]


def code_bits(problem: Problem) -> int:
    """Bits per code of ``problem``'s prepared weight (AWQ counts as 4-bit)."""
    fmt = problem.format
    return fmt.bits if isinstance(fmt, GPTQ) else 4


def weight_bytes(problem: Problem) -> float:
    """Bytes of a prepared weight of ``problem``: the codes, 2-byte scales and one byte of
    zero point per group and output."""
    gs = getattr(problem.format, "group_size", -1)
    k, n = problem["K"], problem["N"]
    return grouped_weight_bytes(k, n, code_bits(problem), gs if gs > 0 else k, scale_bytes=2, zero_bits=8)


class PairedGPTQKernel(LinearKernel):
    """A GPTQ linear whose prepared state holds pair-interleaved codes (module docstring)."""

    format: ClassVar[str] = "gptq"
    #: The backend's GPTQ → prepared-state transform (constructed with the GPTQ format).
    transform: ClassVar[Callable[[GPTQ], Transform[Tensors, PairedWeights]]]
    #: The prepared state that transform makes: a call refuses anything else.
    prepared_type: ClassVar[type[PairedWeights]]

    @classmethod
    def layout_supports(cls, fmt: GPTQ, problem: Problem) -> Support:
        """The backend's own limits (groups, shapes), asked once bits and dtype passed."""
        return Support.yes()

    @classmethod
    def gptq_supports(cls, fmt: GPTQ, problem: Problem) -> Support:
        """:meth:`supports` for the weight as GPTQ ``fmt``."""
        if fmt.bits not in SUPPORTED_BITS:
            return Support.no(f"bits={fmt.bits}: {cls.name} runs {'- and '.join(map(str, SUPPORTED_BITS))}-bit codes")
        if problem.act_dtype not in ACT_DTYPES:
            names = " and ".join(dtype_name(d) for d in ACT_DTYPES)
            return Support.no(f"activation dtype {dtype_name(problem.act_dtype)}: {cls.name} takes {names}")
        return cls.layout_supports(fmt, problem)

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        fmt = problem.format
        if not isinstance(fmt, GPTQ):
            return Support.no(f"format {fmt.slug} is not GPTQ")
        return cls.gptq_supports(fmt, problem)

    def _gptq(self, tensors: Tensors) -> tuple[GPTQ, Tensors]:
        """The weight as GPTQ: its format and tensors."""
        return self.fmt, tensors  # type: ignore[return-value]

    def _gptq_format(self) -> GPTQ:
        return self.fmt  # type: ignore[return-value]

    def prepare(self, tensors: Tensors, *, dtype: torch.dtype | None = None) -> PairedWeights:
        if dtype is not None and dtype not in ACT_DTYPES:
            names = ", ".join(dtype_name(d) for d in ACT_DTYPES)
            raise KernelInputError(f"dtype: expected {names}, got {dtype}")
        fmt, gptq = self._gptq(stored_on(tensors, self.device, where=f"{self.name} prepare"))
        return type(self).transform(fmt).apply(gptq)

    @staticmethod
    def launcher() -> Callable[[torch.Tensor, Any], torch.Tensor]:
        """The backend's ``linear(x, prepared)`` for a contiguous ``x`` ``[..., K]`` with at
        least one row, already permuted by ``ret_idx``, returning ``[..., N]``; imported on
        the first call (it imports triton)."""
        raise NotImplementedError

    #: :meth:`launcher`'s answer, looked up by the first call.
    _linear: Callable[[torch.Tensor, Any], torch.Tensor] | None = None

    def launch_input(self, x: torch.Tensor, prepared: Any) -> torch.Tensor:
        """``x`` checked against ``prepared`` and as the launcher takes it: contiguous, permuted
        by ``ret_idx``. Any rank: the launcher reads x's rows from its storage and makes y in
        x's shape, so a model's ``[B, T, K]`` costs no view either way."""
        if type(prepared) is not self.prepared_type:
            raise KernelInputError(
                f"prepared: expected the {self.prepared_type.__name__} that {self.name}.prepare returns, "
                f"got {type(prepared).__name__}"
            )
        check_x(x, prepared.in_features, ACT_DTYPES, prepared.qweight.device)
        return x.index_select(-1, prepared.ret_idx) if prepared.ret_idx is not None else x.contiguous()

    def __call__(self, x: torch.Tensor, prepared: Any) -> torch.Tensor:
        x = self.launch_input(x, prepared)
        if x.numel() == 0:
            return x.new_empty(*x.shape[:-1], prepared.out_features)
        linear = self._linear
        if linear is None:
            linear = self._linear = self.launcher()
        return linear(x, prepared)


class AWQViaGPTQLanes(PairedGPTQKernel):
    """The AWQ kernel of a :class:`PairedGPTQKernel`: listed before it among a class's
    bases (``class B_AWQ(AWQViaGPTQLanes, B_GPTQ)``), the weight goes through the lossless
    AWQ → GPTQ lanes transform and GPTQ's limits are AWQ's."""

    format: ClassVar[str] = "awq"

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        fmt = problem.format
        if not isinstance(fmt, AWQ):
            return Support.no(f"format {fmt.slug} is not AWQ")
        return cls.gptq_supports(gptq_format_for(fmt), problem)

    def _gptq(self, tensors: Tensors) -> tuple[GPTQ, Tensors]:
        fmt: AWQ = self.fmt  # type: ignore[assignment]
        return gptq_format_for(fmt), AWQToGPTQ(fmt).apply(tensors)

    def _gptq_format(self) -> GPTQ:
        return gptq_format_for(self.fmt)  # type: ignore[arg-type]
