"""Small conveniences over the registry for users of the top-level package."""

from __future__ import annotations

from typing import Any

from .formats.base import Format
from .registry import PluginInfo, default_registry

__all__ = ["get_format", "list_plugins"]


def get_format(name: str, **params: Any) -> Format:
    """A format instance by registry name: ``get_format("gptq", bits=4, group_size=128)``."""
    return default_registry().format_class(name).from_params(**params)


def list_plugins() -> list[PluginInfo]:
    """Every plugin the registry knows, loaded or broken, with what it contributed."""
    return default_registry().plugins()
