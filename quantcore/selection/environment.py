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
from typing import Any

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


_KEY_VARS = (ENV_DISABLE, ENV_FORCE, ENV_PREFER, ENV_ALLOW_DENSE)
#: The variables' names as the environment's raw mapping spells them, per encoder.
_RAW_NAMES: dict[Any, tuple[Any, ...]] = {}


def environment_key() -> tuple[object, ...]:
    """The environment as a cached choice depends on it: the variables' raw values.

    Read on every cached ``get_kernel``, so read cheaply: CPython's ``os.environ`` keeps the
    raw mapping every write goes to (``_data``, names through ``encodekey``), and four plain
    lookups there cost a tenth of four ``os.environ.get`` (each encodes the name and decodes
    the value). Anything else standing in for ``os.environ`` is read the ordinary way."""
    env = os.environ
    data, encode = getattr(env, "_data", None), getattr(env, "encodekey", None)
    if type(data) is not dict or encode is None:
        return tuple(env.get(v) for v in _KEY_VARS)
    names = _RAW_NAMES.get(encode)
    if names is None:
        names = _RAW_NAMES[encode] = tuple(encode(v) for v in _KEY_VARS)
    return tuple(map(data.get, names))


def _names(var: str) -> tuple[str, ...]:
    raw = os.environ.get(var, "")
    return tuple(n.strip() for n in raw.split(",") if n.strip())
