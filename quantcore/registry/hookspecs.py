"""The hooks a quantcore plugin implements. A plugin is any module or object with
functions marked ``@hookimpl`` whose names match these; publish it under the
``quantcore`` entry-point group and it loads like the built-ins do::

    [project.entry-points.quantcore]
    my_backend = "my_package.quantcore_plugin"
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from ..formats.base import Format
    from ..kernel import Kernel

__all__ = ["PROJECT", "QuantcoreSpecs", "hookimpl", "hookspec"]

PROJECT = "quantcore"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class QuantcoreSpecs:
    @hookspec
    def quantcore_formats(self) -> Iterable[type[Format]]:
        """Format classes this plugin contributes (subclasses of :class:`Format`)."""
        raise NotImplementedError

    @hookspec
    def quantcore_kernels(self) -> Iterable[type[Kernel]]:
        """Kernel classes this plugin contributes (subclasses of :class:`Kernel`)."""
        raise NotImplementedError

    @hookspec
    def quantcore_conformance_cases(self) -> Iterable[object]:
        """Conformance cases (:class:`quantcore.conformance.Case`) for formats this plugin
        knows; every kernel registered for a case's format runs it."""
        raise NotImplementedError
