"""Short dtype names used in ids, tables and the CLI (``bf16``, ``fp16``, ``fp32``)."""

from __future__ import annotations

import torch

from .errors import InvalidArgumentError

__all__ = ["dtype_name", "parse_dtype"]

_SHORT = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.float64: "fp64",
}
_BY_NAME = {v: k for k, v in _SHORT.items()} | {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "float": torch.float32,
    "float64": torch.float64,
}


def dtype_name(dtype: torch.dtype) -> str:
    return _SHORT.get(dtype, str(dtype).removeprefix("torch."))


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return _BY_NAME[name.lower().removeprefix("torch.")]
    except KeyError:
        raise InvalidArgumentError(
            f"dtype: expected one of {sorted(_BY_NAME)}, got {name!r}"
        ) from None
