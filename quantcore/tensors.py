"""Checks for named tensors: shape, dtype, device, values, with messages that name them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from .errors import TensorFormatError

__all__ = ["describe", "reject_unknown", "require_tensor", "require_tensors"]


def describe(t: torch.Tensor) -> str:
    """``(512, 4096) int32 on cpu`` — how a tensor is named in error messages."""
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} on {t.device}"


def reject_unknown(
    tensors: Mapping[str, torch.Tensor], known: Iterable[str], *, where: str, takes: str
) -> None:
    """Refuse tensor names a format does not define; ``takes`` says what it does take."""
    unknown = sorted(set(tensors) - set(known))
    if unknown:
        raise TensorFormatError(f"{where}: unexpected tensor(s) {', '.join(unknown)}; {takes}")


def require_tensors(
    tensors: Mapping[str, torch.Tensor], names: Iterable[str], *, where: str
) -> None:
    missing = [n for n in names if n not in tensors]
    if missing:
        raise TensorFormatError(
            f"{where}: missing tensor(s) {', '.join(missing)}; got {sorted(tensors)}"
        )


def require_tensor(
    name: str,
    t: object,
    *,
    shape: Sequence[int] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    where: str = "",
    error: type[Exception] = TensorFormatError,
) -> torch.Tensor:
    """Return ``t`` if it is a tensor with this shape and one of these dtypes, else raise."""
    prefix = f"{where}: " if where else ""
    if not isinstance(t, torch.Tensor):
        raise error(f"{prefix}{name}: expected a torch.Tensor, got {type(t).__name__}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise error(f"{prefix}{name}: expected shape {tuple(shape)}, got {describe(t)}")
    if dtypes is not None and t.dtype not in dtypes:
        wanted = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise error(f"{prefix}{name}: expected dtype {wanted}, got {describe(t)}")
    return t
