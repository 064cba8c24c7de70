"""Storage formats. Each lives in its own module; the built-ins are contributed to the
registry by :mod:`quantcore.registry.builtin_formats`, the same way a third party's would be."""

from .base import Format

__all__ = ["Format"]
