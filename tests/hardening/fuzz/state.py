"""Prepared states as data: every tensor in one (dataclass fields, tuples, dicts, nested),
by path, so two states can be compared bit for bit or hashed across processes."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["differences", "digest", "flatten"]


def flatten(obj: Any, path: str = "") -> dict[str, Any]:
    """``{path: tensor or plain value}`` for everything reachable in a prepared state."""
    out: dict[str, Any] = {}
    if isinstance(obj, torch.Tensor):
        out[path] = obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out[f"{path}<{type(obj).__name__}>"] = None
        for f in dataclasses.fields(obj):
            out.update(flatten(getattr(obj, f.name), f"{path}.{f.name}"))
    elif isinstance(obj, Mapping):
        for k in sorted(obj, key=repr):
            out.update(flatten(obj[k], f"{path}[{k!r}]"))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{path}[{i}]"))
    else:
        out[path] = obj if isinstance(obj, (int, float, str, bool, type(None), torch.dtype)) else type(obj).__name__
    return out


def _bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def differences(a: Any, b: Any) -> list[str]:
    """Where two states differ: a path, a dtype, a shape or a single bit."""
    fa, fb = flatten(a), flatten(b)
    out = [f"{p}: only in one" for p in sorted(set(fa) ^ set(fb))]
    for p in sorted(set(fa) & set(fb)):
        x, y = fa[p], fb[p]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                out.append(f"{p}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}")
            elif _bytes(x) != _bytes(y):
                out.append(f"{p}: bytes differ")
        elif x != y and not (isinstance(x, float) and isinstance(y, float) and x != x and y != y):
            out.append(f"{p}: {x!r} vs {y!r}")
    return out


def digest(obj: Any) -> str:
    h = hashlib.sha256()
    for path, v in flatten(obj).items():
        h.update(path.encode())
        if isinstance(v, torch.Tensor):
            h.update(f"{v.dtype}{tuple(v.shape)}".encode())
            h.update(_bytes(v))
        else:
            h.update(repr(v).encode())
    return h.hexdigest()
