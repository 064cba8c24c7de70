"""What the command line and the pytest plugin accept as ``--format`` and ``--backend``
(``--device``: :func:`quantcore.cli.arguments.check_device`): a name nothing is called,
or filters that leave no cell, are usage errors naming what is known, never a run of
zero cells."""

from __future__ import annotations

from collections.abc import Sequence

from quantcore.errors import InvalidArgumentError
from quantcore.registry import Registry, default_registry

__all__ = ["check_filters", "no_cells_message"]


def _listed(names: Sequence[str]) -> str:
    return ", ".join(sorted(set(names)))


def check_filters(
    formats: Sequence[str], kernels: Sequence[str], registry: Registry | None = None,
    *, format_option: str = "--format", kernel_option: str = "--backend",
) -> None:
    """Every filter names something registered: a format by name or by a case's slug, a
    kernel or plugin by name."""
    reg = registry or default_registry()
    entries = reg.kernels()
    known_kernels = {e.cls.name for e in entries} | {e.plugin for e in entries}
    for name in kernels:
        if name not in known_kernels:
            raise InvalidArgumentError(
                f"{kernel_option} {name}: no kernel or plugin is called that; known: {_listed(known_kernels)}")
    names = set(reg.formats())
    slugs = {c.format.slug for c in reg.conformance_cases()}
    for name in formats:
        if name not in names and name not in slugs:
            families = sorted({s.split("-", 1)[0] for s in slugs})
            raise InvalidArgumentError(
                f"{format_option} {name}: no format or case format is called that; formats: {_listed(names)}; "
                f"or a case's format slug, e.g. {', '.join(sorted(slugs)[:3])} (families {', '.join(families)}; "
                f"'quantcore conformance --group format' lists every slug)")


def no_cells_message(formats: Sequence[str], kernels: Sequence[str], registry: Registry | None = None) -> str:
    """Why known filters leave no cell: which formats the named kernels run."""
    reg = registry or default_registry()
    runs = sorted({f"{e.cls.name}: {e.cls.format}" for e in reg.kernels()
                   if e.cls.name in kernels or e.plugin in kernels})
    chosen = " ".join([*(f"--format {f}" for f in formats), *(f"--backend {k}" for k in kernels)])
    return f"no conformance cell matches {chosen}" + (f" (the kernels run {'; '.join(runs)})" if runs else "")
