"""What every ``act_quant_lora`` kernel shares: the prepared per-layer state, the
problem checks, the call checks and the output allocation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ...errors import KernelInputError, UnsupportedProblemError
from ...formats.svdquant import SVDQuantAct
from ...formats.svdquant.numerics import fdiv
from ...kernel import Support
from ...ops.act_quant_lora import ACT_DTYPES, ActQuantLoraKernel, check_activation
from ...problem import Problem
from ...schema import Fields, Maybe, OneOf, TensorSpec
from ...tensors import stored_on

__all__ = ["OutputLayout", "SVDQuantKernel", "SVDQuantWeights", "allocate_outputs", "output_layout"]


@dataclass(frozen=True)
class SVDQuantWeights:
    """One layer's tensors on the kernel's device, ready for any number of calls."""

    lora_down: torch.Tensor  # [N, R], the activation dtype, contiguous
    rsmooth: torch.Tensor | None  # [N] float32 = 1 / smooth, or None
    dtype: torch.dtype  # the activation dtype the layer was prepared for
    fmt: SVDQuantAct  # the format it was prepared for: the kernel's output format must match

    @property
    def n(self) -> int:
        return self.lora_down.shape[0]

    @property
    def r(self) -> int:
        return self.lora_down.shape[1]


OutputLayout = tuple[tuple[tuple[int, int], torch.dtype], ...]


def output_layout(fmt: SVDQuantAct, m_pad: int, n: int, r: int) -> OutputLayout:
    """The ``(shape, dtype)`` of ``qout``, ``oscales`` and ``lora_act_out`` for ``m_pad``
    (padded) rows: what a launcher that allocates per call computes once."""
    return (((m_pad, n // 2), torch.uint8), ((n // fmt.block, m_pad), fmt.scale_dtype),
            ((m_pad, r), torch.float32))


def allocate_outputs(
    fmt: SVDQuantAct, m: int, n: int, r: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uninitialised ``qout``, ``oscales`` and ``lora_act_out`` for M rows (padded)."""
    (q, qd), (s, sd), (lo, ld) = output_layout(fmt, fmt.padded_rows(m), n, r)
    return (torch.empty(q, dtype=qd, device=device), torch.empty(s, dtype=sd, device=device),
            torch.empty(lo, dtype=ld, device=device))


class SVDQuantKernel(ActQuantLoraKernel):
    format: ClassVar[str] = "svdquant"
    #: True: NVFP4 only; False: INT4 only; None: both.
    fp4_only: ClassVar[bool | None] = None
    #: The largest LoRA rank the kernel takes (None: any).
    max_rank: ClassVar[int | None] = None

    @classmethod
    def supports(cls, problem: Problem) -> Support:
        fmt = problem.format
        if not isinstance(fmt, SVDQuantAct):
            return Support.no(f"format {fmt.slug} is not svdquant")
        if cls.fp4_only is not None and fmt.fp4 != cls.fp4_only:
            want = "NVFP4 (fp4=True)" if cls.fp4_only else "INT4 (fp4=False)"
            return Support.no(f"{fmt.slug}: this kernel writes {want} only")
        if problem.act_dtype not in ACT_DTYPES:
            return Support.no(f"activation dtype {problem.act_dtype}: expected float16 or bfloat16")
        n, r = problem.get("N"), problem.get("R")
        if n is not None and (n <= 0 or n % fmt.block):
            return Support.no(f"N={n}: not a multiple of the {fmt.slug} block size {fmt.block}")
        if r is not None and cls.max_rank is not None and r > cls.max_rank:
            return Support.no(f"R={r}: the [BM, R] LoRA accumulator lives in registers; R <= {cls.max_rank}")
        return Support.yes()

    def prepare(
        self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None
    ) -> SVDQuantWeights:
        fmt = self.fmt
        assert isinstance(fmt, SVDQuantAct)
        tensors = stored_on(tensors, self.device, where=f"{self.name}.prepare")
        dims = fmt.validate(tensors)
        dtype = dtype or tensors["lora_down"].dtype
        if dtype not in ACT_DTYPES:
            raise KernelInputError(f"dtype: expected float16 or bfloat16 activations, got {dtype}")
        ok, why = self.supports(Problem.of(fmt, dims, dtype))
        if not ok:
            raise UnsupportedProblemError(f"{self.name}: {why}")
        smooth = tensors.get("smooth")
        return SVDQuantWeights(
            lora_down=tensors["lora_down"].to(dtype).contiguous(),
            rsmooth=fdiv(1.0, smooth.float()).contiguous() if smooth is not None else None,
            dtype=dtype,
            fmt=fmt,
        )

    def prepared_schema(self, dims: Mapping[str, int]) -> OneOf:
        n, r = dims["N"], dims["R"]
        return OneOf(*(Fields(
            SVDQuantWeights, lora_down=TensorSpec((n, r), (d,)), rsmooth=Maybe(TensorSpec((n,), (torch.float32,))),
            dtype=d, fmt=self.fmt,
        ) for d in ACT_DTYPES))

    def check_call(self, x: Any, prepared: Any) -> int:
        """Validate a call; returns M."""
        if type(prepared) is not SVDQuantWeights:
            raise KernelInputError(
                f"prepared: expected the SVDQuantWeights that {self.name}.prepare returns, "
                f"got {type(prepared).__name__}"
            )
        if prepared.fmt is not self.fmt and prepared.fmt != self.fmt:
            raise KernelInputError(
                f"prepared: made for {prepared.fmt.slug}, but this {self.name} writes {self.fmt.slug}; "
                f"prepare the layer with a kernel for {self.fmt.slug}"
            )
        lora_down = prepared.lora_down
        return check_activation(x, n=lora_down.shape[0], dtype=prepared.dtype, device=lora_down.device)
