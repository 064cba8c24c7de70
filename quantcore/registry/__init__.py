"""The process-wide registry and its entry points for users."""

from __future__ import annotations

import threading

from .hookspecs import hookimpl, hookspec
from .manager import (
    CASES_ENTRY_POINT_GROUP,
    ENTRY_POINT_GROUP,
    ENV_BLOCK,
    BrokenPlugin,
    KernelEntry,
    PluginInfo,
    Registry,
)

__all__ = [
    "CASES_ENTRY_POINT_GROUP",
    "ENTRY_POINT_GROUP",
    "ENV_BLOCK",
    "BrokenPlugin",
    "KernelEntry",
    "PluginInfo",
    "Registry",
    "default_registry",
    "hookimpl",
    "hookspec",
    "register",
    "unregister",
]

_default: Registry | None = None
_lock = threading.Lock()


def default_registry() -> Registry:
    """The registry ``get_kernel`` uses; entry points load on first use, not at import."""
    global _default
    if _default is None:
        with _lock:
            if _default is None:
                _default = Registry()
    return _default


def register(plugin: object, name: str | None = None) -> str:
    """Add a plugin (module or object with ``@hookimpl`` functions) at run time."""
    return default_registry().register(plugin, name)


def unregister(name: str) -> None:
    default_registry().unregister(name)
