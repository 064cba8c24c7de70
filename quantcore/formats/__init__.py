"""Storage formats. Each lives in its own module; the built-ins are contributed to the
registry by :mod:`quantcore.formats.plugin`, the same way a third party's would be."""

from .base import Format

__all__ = ["Format"]
