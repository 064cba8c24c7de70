"""The Format interface: a named, versioned storage format with its golden math.

A format instance is a frozen dataclass of its parameters (bits, group_size, ...), in
the manner of torchao's layouts: hashable, comparable, cheap to pass around. Its golden
``quantize`` / ``dequantize`` are plain float torch written from the format's spec and
are what every kernel is checked against; they favour clarity over speed.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

__all__ = ["Format"]


class Format(ABC):
    """Base class of every storage format. Subclasses are ``@dataclass(frozen=True)``."""

    #: Registry name, e.g. ``"gptq"``; what ``get_kernel("gptq", ...)`` looks up.
    name: ClassVar[str]
    #: Bumped when the meaning of stored tensors changes.
    version: ClassVar[int] = 1
    #: The op the format's tensors feed (see ``quantcore.ops``).
    op: ClassVar[str] = "linear"

    @property
    @abstractmethod
    def slug(self) -> str:
        """Short id of this parameterisation for tables and test ids: ``gptq4-g128-asym``."""

    @abstractmethod
    def validate(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """Check a set of stored tensors against this format; return the problem dims
        they imply (for a linear: ``{"K": in_features, "N": out_features}``). Raises
        :class:`~quantcore.errors.TensorFormatError` naming the tensor at fault."""

    @abstractmethod
    def quantize(
        self, weight: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> dict[str, torch.Tensor]:
        """Golden quantizer from a dense float weight to this format's stored tensors."""

    @abstractmethod
    def dequantize(
        self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype = torch.float64
    ) -> torch.Tensor:
        """Golden dequantizer back to a dense weight in the op's natural layout."""

    def params(self) -> dict[str, Any]:
        """This instance's parameters as plain data (for JSON and explain tables)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            out[f.name] = str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v
        return out

    @classmethod
    def from_params(cls, **params: Any) -> Format:
        """Build an instance from loose parameters (CLI strings, config files)."""
        return cls(**params)
