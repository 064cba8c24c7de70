"""A Problem: what a kernel is asked to run — op, format parameters, shape and dtype."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .dtypes import dtype_name
from .errors import InvalidArgumentError
from .formats.base import Format

__all__ = ["MAX_DIM", "Problem"]

#: The largest size a problem dim may have: far above any model's (a vocabulary of a few
#: hundred thousand, prefills of a million tokens), far below what would overflow an
#: index or ask for an allocation no machine has.
MAX_DIM = 1 << 24


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
        if not isinstance(self.format, Format):
            raise InvalidArgumentError(f"problem format: expected a Format instance, got {self.format!r:.80}")
        if not isinstance(self.act_dtype, torch.dtype) or not self.act_dtype.is_floating_point:
            raise InvalidArgumentError(
                f"problem dtype: expected a floating-point torch.dtype (torch.bfloat16, ...), got {self.act_dtype!r}"
            )
        if not isinstance(self.op, str):
            raise InvalidArgumentError(f"problem op: expected an op name, got {self.op!r:.80}")
        if not self.op:
            object.__setattr__(self, "op", self.format.op)
        object.__setattr__(self, "dims", tuple(sorted(check_dims(self.dims))))

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
        pairs = tuple(dims.items()) if isinstance(dims, Mapping) else dims  # anything else: refused by check_dims
        return cls(format=format, dims=pairs, act_dtype=dtype, op=op or getattr(format, "op", ""))  # type: ignore[arg-type]

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


def check_dims(dims: object) -> list[tuple[str, int]]:
    """``(name, size)`` pairs, each size an integer in ``[0, MAX_DIM]``; anything else is an
    :class:`~quantcore.errors.InvalidArgumentError` naming the dim."""
    try:
        pairs = list(dims.items()) if hasattr(dims, "items") else list(dims)  # type: ignore[union-attr, call-overload]
    except TypeError:
        raise InvalidArgumentError(f"problem dims: expected a mapping of dim names to sizes, got {dims!r:.80}") from None
    out = []
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise InvalidArgumentError(f"problem dims: expected (name, size) pairs, got {pair!r:.80}")
        name, size = pair
        if isinstance(size, bool) or not hasattr(size, "__index__"):
            raise InvalidArgumentError(f"{name}: expected an integer size, got {size!r:.40}")
        size = int(size.__index__())
        if not 0 <= size <= MAX_DIM:
            raise InvalidArgumentError(f"{name}: expected a size in [0, {MAX_DIM}], got {size}")
        out.append((name, size))
    if len({n for n, _ in out}) != len(out):
        raise InvalidArgumentError(f"problem dims: a dim named twice in {out}")
    return out
