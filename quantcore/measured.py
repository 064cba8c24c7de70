"""Measured kernel times: the tables shipped inside the package, and this machine's cache.

A table is one device's: for each (format, op, activation dtype, shape class) it holds the
median seconds per call of every kernel timed there (and the kernels the tuner refused, with
why). ``get_kernel`` ranks by a matching entry before it falls back to the kernels' declared
costs (:mod:`quantcore.cost`):

* the **cache**, ``$QUANTCORE_CACHE/kernel-times/<device>.json`` (default
  ``~/.cache/quantcore``): what ``tune=True`` measured on this machine, used while the
  torch / triton / quantcore versions it was measured with are the ones installed;
* the **shipped** tables, ``quantcore/tables/<device>.json``: made on that device with
  ``quantcore tune … --export``, used whatever the versions.

A malformed file — unreadable, not a regular file (a FIFO would block the reader), larger
than a table can be, truncated JSON, wrong keys or values, another device's table — is
ignored with one warning naming it (on the ``quantcore`` logger), never a crash
or a wrong choice; a kernel a table names that is no longer registered has its times
ignored, with one warning. Writers take a file lock and replace the file atomically, so
concurrent processes never leave a torn or half-merged cache.
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .cost import shape_class
from .dtypes import dtype_name
from .errors import InvalidArgumentError
from .files import read_json, regular_file, replace_json
from .problem import Problem

__all__ = [
    "SCHEMA",
    "Measurement",
    "cache_file",
    "device_slug",
    "entry_key",
    "export",
    "lookup",
    "lookup_cached",
    "shipped_file",
    "store",
    "versions",
]

log = logging.getLogger(__name__)

SCHEMA = "quantcore.kernel-times/1"
#: A table larger than this is not one quantcore wrote (a full one holds a few thousand entries).
MAX_TABLE_BYTES = 16 << 20
SHIPPED = Path(__file__).resolve().parent / "tables"
LOCK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Measurement:
    """One entry: median seconds per call by kernel, and the kernels refused, with why."""

    seconds: Mapping[str, float]
    refused: Mapping[str, str] = field(default_factory=dict)
    #: How it was timed: ``cuda-graph``, ``do_bench``, ``perf_counter``…
    timing: str = ""
    #: ``torch X|triton Y|quantcore Z`` at measuring time.
    versions: str = ""
    #: Where it came from, for ``explain``: ``shipped table <file>`` or ``cache <file>``.
    source: str = ""

    def covers(self, kernels: Iterable[str]) -> bool:
        return all(k in self.seconds or k in self.refused for k in kernels)

    def as_json(self) -> dict[str, Any]:
        return {"seconds": dict(self.seconds), "refused": dict(self.refused), "timing": self.timing,
                "versions": self.versions}


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def cache_dir() -> Path:
    """``$QUANTCORE_CACHE``, or ``~/.cache/quantcore`` when it is unset or empty."""
    return Path(os.environ.get("QUANTCORE_CACHE", "").strip() or Path.home() / ".cache" / "quantcore")


def cache_file(device_name: str) -> Path:
    return cache_dir() / "kernel-times" / f"{device_slug(device_name)}.json"


def shipped_file(device_name: str) -> Path:
    return SHIPPED / f"{device_slug(device_name)}.json"


def entry_key(problem: Problem) -> str:
    return "|".join((problem.format.slug, problem.op, dtype_name(problem.act_dtype), shape_class(problem)))


def versions() -> str:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "-"

    return f"torch {torch.__version__}|triton {version('triton')}|quantcore {version('quantcore')}"


# --- reading -------------------------------------------------------------------------------------


class _Malformed(ValueError):
    pass


def _parse(data: Any, device_name: str, source: str) -> dict[str, Measurement]:
    """The entries of a table's JSON, or :class:`_Malformed` saying what is wrong."""
    if not isinstance(data, dict):
        raise _Malformed(f"expected a JSON object, got {type(data).__name__}")
    missing = {"schema", "device_name", "entries"} - set(data)
    if missing:
        raise _Malformed(f"missing keys {sorted(missing)}")
    if data["schema"] != SCHEMA:
        raise _Malformed(f"schema {data['schema']!r}, expected {SCHEMA!r}")
    if data["device_name"] != device_name:
        raise _Malformed(f"a table for {data['device_name']!r}, not for this device ({device_name!r})")
    if not isinstance(data["entries"], dict):
        raise _Malformed("entries: expected an object")
    out: dict[str, Measurement] = {}
    for key, entry in data["entries"].items():
        if not isinstance(key, str) or key.count("|") != 3:
            raise _Malformed(f"entry {key!r}: expected 'format|op|dtype|shape class'")
        if not isinstance(entry, dict) or not isinstance(entry.get("seconds"), dict):
            raise _Malformed(f"entry {key!r}: expected an object with 'seconds'")
        seconds, refused = entry["seconds"], entry.get("refused", {})
        if not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v) and v > 0 for k, v in seconds.items()):
            raise _Malformed(f"entry {key!r}: seconds must map kernel names to positive numbers")
        if not isinstance(refused, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in refused.items()):
            raise _Malformed(f"entry {key!r}: refused must map kernel names to reasons")
        timing, vers = entry.get("timing", ""), entry.get("versions", "")
        if not isinstance(timing, str) or not isinstance(vers, str):
            raise _Malformed(f"entry {key!r}: timing and versions must be strings")
        out[key] = Measurement(dict(seconds), dict(refused), timing, vers, source)
    return out


#: path -> ((mtime_ns, size), entries or None when malformed)
_tables: dict[Path, tuple[tuple[int, int], dict[str, Measurement] | None]] = {}
_warned: set[tuple[str, str]] = set()
_read_lock = threading.Lock()


def _warn_once(path: Path, message: str) -> None:
    key = (str(path), message)
    if key not in _warned:
        _warned.add(key)
        log.warning("ignoring %s: %s", path, message)


def _table(path: Path, device_name: str, kind: str) -> dict[str, Measurement] | None:
    """The file's entries (parsed once per change of the file), or None: absent or malformed."""
    try:
        stat = path.stat()
    except OSError:
        return None
    signature = (stat.st_mtime_ns, stat.st_size)
    with _read_lock:
        hit = _tables.get(path)
        if hit is not None and hit[0] == signature:
            return hit[1]
        entries: dict[str, Measurement] | None
        try:
            entries = _parse(read_json(path, limit=MAX_TABLE_BYTES, error=InvalidArgumentError), device_name,
                             f"{kind} {path.name}")
        except (InvalidArgumentError, _Malformed) as exc:
            _warn_once(path, f"malformed kernel-times table ({exc})")
            entries = None
        _tables[path] = (signature, entries)
        return entries


def _known_only(m: Measurement, path: Path, known: Callable[[str], bool] | None) -> Measurement:
    if known is None:
        return m
    unknown = sorted(k for k in (*m.seconds, *m.refused) if not known(k))
    if not unknown:
        return m
    _warn_once(path, f"it names kernels that are not registered ({', '.join(unknown)}): their times are ignored")
    return Measurement({k: v for k, v in m.seconds.items() if k not in unknown},
                       {k: v for k, v in m.refused.items() if k not in unknown}, m.timing, m.versions, m.source)


def lookup_cached(problem: Problem, device_name: str, *, known: Callable[[str], bool] | None = None) -> Measurement | None:
    """This machine's cached measurement of ``problem``'s shape class, if made with the
    versions installed now."""
    path = cache_file(device_name)
    m = (_table(path, device_name, "cache") or {}).get(entry_key(problem))
    if m is None or m.versions != versions():
        return None
    return _known_only(m, path, known)


def lookup(problem: Problem, device_name: str, *, known: Callable[[str], bool] | None = None) -> Measurement | None:
    """The cached measurement, else the shipped table's, else None. ``known(kernel)`` says
    whether a kernel a table names is still registered (the others' times are ignored)."""
    if not device_name:
        return None
    hit = lookup_cached(problem, device_name, known=known)
    if hit is not None:
        return hit
    path = shipped_file(device_name)
    m = (_table(path, device_name, "shipped table") or {}).get(entry_key(problem))
    return _known_only(m, path, known) if m is not None else None


# --- writing -------------------------------------------------------------------------------------

#: Bumped by every store in this process: a choice cached before it may be stale.
_generation = 0


def generation() -> int:
    return _generation


def _update(path: Path, device_name: str, entries: Mapping[str, Measurement]) -> None:
    """Merge ``entries`` into ``path`` under a file lock, then replace it atomically."""

    def merged(path: Path) -> dict[str, Any]:
        current: dict[str, Any] = {}
        if path.exists():
            try:
                table = read_json(path, limit=MAX_TABLE_BYTES, error=InvalidArgumentError)
                current = {k: m.as_json() for k, m in _parse(table, device_name, "").items()}
            except (InvalidArgumentError, _Malformed) as exc:
                _warn_once(path, f"malformed kernel-times table, rewritten ({exc})")
        current.update({k: m.as_json() for k, m in entries.items()})
        return {"schema": SCHEMA, "device_name": device_name, "entries": dict(sorted(current.items()))}

    replace_json(path, merged, lock_timeout_s=LOCK_TIMEOUT_S)


def store(problem: Problem, device_name: str, measurement: Measurement) -> None:
    """Add one measurement to this machine's cache. A cache that cannot be written (a
    read-only home, a lock held too long) costs the next process a measurement, nothing
    more: it is logged, not raised."""
    global _generation
    _generation += 1
    try:
        _update(cache_file(device_name), device_name, {entry_key(problem): measurement})
    except Exception as exc:  # the cache is an optimisation: never fail the caller
        log.warning("could not write the kernel-times cache %s: %s: %s", cache_file(device_name),
                    type(exc).__name__, exc)


def export(path: Path, device_name: str, entries: Mapping[str, Measurement]) -> None:
    """Write (or merge into) a table to ship: ``quantcore tune … --export PATH``. Refuses to
    merge into another device's table."""
    path = Path(path)
    if path.exists():
        regular_file(path, error=InvalidArgumentError)  # a directory or a FIFO is not a table
    try:
        found = read_json(path, limit=MAX_TABLE_BYTES, error=InvalidArgumentError)
        other = found.get("device_name") if isinstance(found, dict) else None
    except InvalidArgumentError:
        other = None
    if isinstance(other, str) and other != device_name:
        raise InvalidArgumentError(f"--export {path}: a table for {other!r}, not for this device ({device_name!r})")
    try:
        _update(path, device_name, entries)
    except OSError as exc:
        raise InvalidArgumentError(f"--export {path}: cannot be written ({exc.strerror or exc})") from None
