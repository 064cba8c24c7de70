"""Reading the small files a user, a cache or a checkpoint hands quantcore (JSON configs,
indexes, kernel-time tables) without trusting them: a regular file — never a FIFO that
blocks the reader or a device that never ends — of bounded size, holding UTF-8 JSON.

Every failure is one error naming the file and what is wrong with it, of the type the
caller asks for (:class:`~quantcore.errors.TensorFormatError` for a checkpoint's files,
:class:`~quantcore.errors.InvalidArgumentError` for a file an option or variable names).
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import QuantCoreError, TensorFormatError

__all__ = ["MAX_TEXT_BYTES", "read_json", "read_text", "regular_file", "replace_json"]

#: Larger than any config, index or table quantcore reads (a 1000-shard index is ~10 MB).
MAX_TEXT_BYTES = 64 << 20


def regular_file(path: str | os.PathLike[str], *, error: type[QuantCoreError] = TensorFormatError) -> os.stat_result:
    """The ``stat`` of ``path`` (symlinks followed) if it is a regular file, else ``error``."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a socket or other")
        raise error(f"{path}: expected a regular file, got {kind}")
    return info


def read_text(path: str | os.PathLike[str], *, limit: int = MAX_TEXT_BYTES,
              error: type[QuantCoreError] = TensorFormatError) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes."""
    info = regular_file(path, error=error)
    if info.st_size > limit:
        raise error(f"{path}: {info.st_size} bytes, more than the {limit} a file of this kind may have")
    try:
        # O_NONBLOCK: had the path been swapped for a FIFO since the stat, open would not wait.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise error(f"{path}: expected a regular file")
            data = f.read(limit + 1)
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise error(f"{path}: more than the {limit} bytes a file of this kind may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from None


def read_json(path: str | os.PathLike[str], *, limit: int = MAX_TEXT_BYTES,
              error: type[QuantCoreError] = TensorFormatError) -> Any:
    """The JSON value of a regular UTF-8 file of at most ``limit`` bytes."""
    text = read_text(path, limit=limit, error=error)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise error(f"{Path(path)}: not valid JSON ({type(exc).__name__}: {exc})") from None
    except RecursionError:
        raise error(f"{Path(path)}: JSON nested too deeply") from None


def replace_json(path: Path, document: Callable[[Path], Any], *, lock_timeout_s: float) -> None:
    """Write ``document(path)`` — the new JSON, made from what ``path`` holds now — over
    ``path``, under a file lock beside it (so concurrent writers merge instead of losing
    each other's entries) and atomically (a temporary file moved over it: a reader never
    sees half a file). ``document`` reads ``path`` itself, inside the lock."""
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=lock_timeout_s):
        data = document(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps(data, indent=1) + "\n")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
