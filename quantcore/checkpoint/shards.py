"""A checkpoint folder's safetensors shards, read without trusting them.

* The index (``model.safetensors.index.json``) must be a JSON object whose
  ``weight_map`` maps tensor names to shard file names.
* A shard file name — from the index or the folder — must stay inside the folder: a
  relative path with no ``..`` part. The name is checked, not where it resolves to, so
  the Hugging Face cache's layout (each file in a snapshot folder a symlink into
  ``../../blobs``) keeps working, while an index cannot name ``../../secrets``.
* A shard must be a regular file (after symlinks), and one safetensors can open: a
  truncated, empty or garbage file is a :class:`~quantcore.errors.TensorFormatError`
  naming it, not the library's own exception.
"""

from __future__ import annotations

import contextlib
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from ..errors import TensorFormatError
from ..files import read_json, regular_file

__all__ = ["INDEX", "inside", "open_shard", "read_index", "read_shard", "shard_names"]

INDEX = "model.safetensors.index.json"


def inside(folder: Path, name: object, source: Path | str) -> Path:
    """``folder / name`` for a shard name that stays inside ``folder``; ``source`` names
    the file that gave the name, for the message."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise TensorFormatError(f"{source}: a shard file name must be a non-empty string, got {name!r:.80}")
    parts = PurePosixPath(name.replace("\\", "/"))
    if parts.is_absolute() or Path(name).is_absolute() or ".." in parts.parts:
        raise TensorFormatError(f"{source}: shard {name!r} is outside the checkpoint folder {folder}; "
                                "expected a file name inside it")
    return folder / name


def read_index(folder: Path) -> dict[str, str] | None:
    """The index's weight map (tensor name → shard file name), or None without an index."""
    path = folder / INDEX
    if not path.exists() and not path.is_symlink():
        return None
    data = read_json(path)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in weight_map.items()):
        raise TensorFormatError(f"{path}: expected a JSON object whose 'weight_map' maps tensor names to shard "
                                f"file names, got {str(data)[:80]}")
    for file in set(weight_map.values()):
        inside(folder, file, path)
    return weight_map


def shard_names(folder: Path, weight_map: dict[str, str] | None) -> list[str]:
    """The shard files: those the index names, else every ``*.safetensors`` of the folder."""
    if weight_map is not None:
        return sorted(set(weight_map.values()))
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise TensorFormatError(f"{folder}: no *.safetensors files")
    return files


def _unreadable(path: Path, exc: BaseException) -> TensorFormatError:
    return TensorFormatError(f"{path}: not a readable safetensors file ({type(exc).__name__}: {exc})")


def open_shard(path: Path, stack: contextlib.ExitStack) -> Any:
    """A ``safe_open`` handle on ``path`` (closed with ``stack``), and its tensor names read."""
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("loading checkpoints needs safetensors: pip install 'quantcore[io]'") from None
    regular_file(path)
    try:
        handle = stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
        handle.keys()
    except Exception as exc:  # safetensors raises its own SafetensorError, and OSError
        raise _unreadable(path, exc) from None
    return handle


def get_tensor(handle: Any, path: Path, name: str) -> torch.Tensor:
    try:
        return handle.get_tensor(name)  # type: ignore[no-any-return]
    except Exception as exc:  # a header that promises bytes the file does not hold
        raise _unreadable(path, exc) from None


def read_shard(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one shard."""
    try:
        from safetensors.torch import load_file
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError("reading checkpoints needs safetensors: pip install 'quantcore[io]'") from None
    regular_file(path)
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own SafetensorError, and OSError
        raise _unreadable(path, exc) from None
