"""A Problem: what a kernel is asked to run — op, format parameters, shape and dtype."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .dtypes import dtype_name
from .formats.base import Format

__all__ = ["Problem"]


@dataclass(frozen=True)
class Problem:
    """Hashable description of one call site.

    ``dims`` names the op's dimensions as docs/ does (a linear: ``M`` rows of the
    activation, ``K`` in-features, ``N`` out-features). Kernels read them with
    ``problem["K"]``; a kernel that needs a dim the problem lacks treats it as unknown.
    """

    format: Format
    dims: tuple[tuple[str, int], ...] = ()
    act_dtype: torch.dtype = torch.bfloat16
    op: str = field(default="")

    def __post_init__(self) -> None:
        if not self.op:
            object.__setattr__(self, "op", self.format.op)
        object.__setattr__(self, "dims", tuple(sorted(self.dims)))

    @classmethod
    def linear(
        cls,
        format: Format,
        *,
        M: int | None = None,
        K: int | None = None,
        N: int | None = None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> Problem:
        dims = {k: v for k, v in {"M": M, "K": K, "N": N}.items() if v is not None}
        return cls(format=format, dims=tuple(dims.items()), act_dtype=dtype, op="linear")

    @classmethod
    def of(
        cls, format: Format, dims: Mapping[str, int], dtype: torch.dtype, op: str | None = None
    ) -> Problem:
        return cls(format=format, dims=tuple(dims.items()), act_dtype=dtype, op=op or format.op)

    def __getitem__(self, name: str) -> int:
        for k, v in self.dims:
            if k == name:
                return v
        raise KeyError(f"problem has no dim {name!r}; it has {[k for k, _ in self.dims]}")

    def get(self, name: str, default: int | None = None) -> int | None:
        return dict(self.dims).get(name, default)

    def describe(self) -> str:
        return f"{self.format.slug}/{self.shape_id()}/{dtype_name(self.act_dtype)}"

    def shape_id(self) -> str:
        return "-".join(f"{k}{v}" for k, v in self._ordered_dims())

    def _ordered_dims(self) -> list[tuple[str, int]]:
        order = "TEMKNR"
        return sorted(
            self.dims, key=lambda kv: (order.index(kv[0]) if kv[0] in order else 99, kv[0])
        )
