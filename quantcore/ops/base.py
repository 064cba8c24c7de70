"""An Op names the computation and its dims; its golden reference runs in float64."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Op"]


@dataclass(frozen=True)
class Op:
    name: str
    dims: tuple[str, ...]
    doc: str
    #: Dims a valid problem may set to 0 (the LoRA rank of ``act_quant_lora``: no branch).
    may_be_zero: tuple[str, ...] = ()
