"""A kernel must leave what it is handed as it was: the activations of a call and the
stored tensors of ``prepare``. The matrix compares them, after the cell ran, with copies
taken before any kernel saw them — as a user would notice, whose ``x`` is still in use."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["tensors_in", "written_inputs"]


def tensors_in(obj: Any, path: str = "", depth: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor reachable in a harness's weights or inputs (dataclass fields, dicts,
    sequences), by path."""
    if isinstance(obj, torch.Tensor):
        return {path: obj}
    out: dict[str, torch.Tensor] = {}
    if depth > 4:
        return out
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            out.update(tensors_in(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name, depth + 1))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(tensors_in(v, f"{path}[{k!r}]" if path else str(k), depth + 1))
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            out.update(tensors_in(v, f"{path}[{i}]", depth + 1))
    return out


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return bool(torch.equal(a, b))


def written_inputs(pristine: Any, inputs: Any, stored: Any, stored_copy: Any) -> str:
    """Why a cell fails because its kernel wrote into what it was handed, or "": the
    activations (the cell's own copy against the drawn original) and the stored tensors
    (against the copy taken when they were drawn)."""
    for before, after, what in ((tensors_in(pristine), tensors_in(inputs), "its input"),
                                (tensors_in(stored_copy or {}), tensors_in(stored), "the stored tensor")):
        for path, now in after.items():
            if path in before and not _same(now, before[path]):
                return f"the kernel wrote into {what} {path}"
    return ""
