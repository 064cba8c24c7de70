"""Package presence without importing: version from metadata, location from find_spec.

Importing triton or cuda.tile at probe time would break the rule that ``import
quantcore`` stays light; whether a package *works* on a device is decided by the
device's prober, which may import it only when that device is asked about.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

__all__ = ["installed_version", "release"]

_RELEASE = re.compile(r"\d+(?:\.\d+)*")


def installed_version(module: str, distributions: tuple[str, ...]) -> tuple[bool, str | None]:
    """(is the module importable by path, the first distribution version found)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    version = None
    for dist in distributions:
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return found, version


def release(version: str) -> tuple[int, ...]:
    """The release numbers a version string starts with, at least three, for comparing:
    ``3.6.0+git1a2b`` → ``(3, 6, 0)``, ``3.6`` → ``(3, 6, 0)``; a string that starts with
    none gives ``(0, 0, 0)``, below every release. A pre-release counts as its release
    (``3.6.0rc1`` → ``(3, 6, 0)``)."""
    match = _RELEASE.match(version.strip())
    numbers = tuple(int(part) for part in match.group().split(".")) if match else ()
    return (*numbers, 0, 0, 0)[:max(3, len(numbers))]
