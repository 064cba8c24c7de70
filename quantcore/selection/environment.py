"""What the caller and the environment ask of a choice, read in one place.

Environment variables (comma-separated kernel or plugin names, except the last):

``QUANTCORE_DISABLE``      never choose these.
``QUANTCORE_FORCE``        choose only this one; if it cannot run, fail and say why.
``QUANTCORE_PREFER``       try these first, in this order (``prefer=`` overrides it).
``QUANTCORE_ALLOW_DENSE``  ``1``: dense copies compete on time like the others.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ENV_ALLOW_DENSE", "ENV_DISABLE", "ENV_FORCE", "ENV_PREFER", "Overrides", "environment_key"]

ENV_DISABLE = "QUANTCORE_DISABLE"
ENV_FORCE = "QUANTCORE_FORCE"
ENV_PREFER = "QUANTCORE_PREFER"
ENV_ALLOW_DENSE = "QUANTCORE_ALLOW_DENSE"


@dataclass(frozen=True)
class Overrides:
    """The caller's and the environment's say over the ranking."""

    prefer: tuple[str, ...] = ()
    disabled: tuple[str, ...] = ()
    forced: tuple[str, ...] = ()
    allow_dense: bool = False

    @classmethod
    def read(cls, prefer: str | Sequence[str] | None = None, allow_dense: bool | None = None) -> Overrides:
        """``prefer`` and ``allow_dense`` as given, else as the environment says."""
        if prefer is None:
            prefs = _names(ENV_PREFER)
        else:
            prefs = (prefer,) if isinstance(prefer, str) else tuple(prefer)
        if allow_dense is None:
            allow_dense = os.environ.get(ENV_ALLOW_DENSE, "").strip().lower() in ("1", "true", "yes")
        return cls(prefs, _names(ENV_DISABLE), _names(ENV_FORCE), allow_dense)


def environment_key() -> tuple[str | None, ...]:
    """The environment as a cached choice depends on it."""
    return tuple(os.environ.get(v) for v in (ENV_DISABLE, ENV_FORCE, ENV_PREFER, ENV_ALLOW_DENSE))


def _names(var: str) -> tuple[str, ...]:
    raw = os.environ.get(var, "")
    return tuple(n.strip() for n in raw.split(",") if n.strip())
