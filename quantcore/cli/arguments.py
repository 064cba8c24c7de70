"""Checks of command-line arguments shared by the commands (the core's and those the
layers above contribute): each failure is an :class:`InvalidArgumentError`, which the
``quantcore`` command prints as one line with exit status 2."""

from __future__ import annotations

from ..errors import InvalidArgumentError
from ..probe import KNOWN_DEVICE_TYPES, normalize_device, probe

__all__ = ["check_device"]


def check_device(device: str, option: str = "--device") -> str:
    """The normalized device if it is present here; else an error naming those that are."""
    dev = normalize_device(device)
    caps = probe(dev)
    if not caps.available:
        here = sorted(d for d in KNOWN_DEVICE_TYPES if probe(d).available)
        raise InvalidArgumentError(f"{option} {device}: not available here ({caps.reason}); available: {', '.join(here)}")
    return dev
