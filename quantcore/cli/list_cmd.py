"""``quantcore list``: plugins (broken ones with their error), formats and kernels."""

from __future__ import annotations

import argparse

from tabulate import tabulate

from ..registry import default_registry
from ..selection.state import selection_state
from .output import emit_json

HELP = "plugins, formats and kernels; broken plugins with their error"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options beyond ``--json``."""


def run(args: argparse.Namespace) -> int:
    reg = default_registry()
    failures = selection_state(reg).failures
    plugins = reg.plugins()
    kernels = sorted(reg.kernels(), key=lambda e: (e.cls.format, e.cls.op, -e.cls.priority, e.cls.name))
    if args.json != "-":
        print(tabulate(
            [(p.name, p.status, p.source, ", ".join(p.formats) or "-", ", ".join(sorted(set(p.kernels))) or "-")
             for p in plugins],
            headers=("plugin", "status", "source", "formats", "kernels"),
        ))
        print()
        print(tabulate(
            [(e.cls.format, e.cls.op, e.cls.name, e.cls.priority, "/".join(sorted(e.cls.requires.device_types)),
              e.plugin, e.cls.description) for e in kernels],
            headers=("format", "op", "kernel", "priority", "devices", "plugin", "description"),
        ))
        broken = reg.broken()
        if broken:
            print("\nbroken plugins:")
            for b in broken:
                print(f"  {b.plugin} [{b.stage}] {b.error}")
        if failures:
            print("\nkernels failed at run time (refused on that device until cleared):")
            for (fmt, op, kernel, device), why in sorted(failures.items()):
                print(f"  {kernel} ({fmt}/{op}) on {device}: {why}")
    emit_json(
        {
            "plugins": [
                {"name": p.name, "status": p.status, "source": p.source, "formats": p.formats,
                 "kernels": p.kernels, "broken": [b.__dict__ for b in p.broken]}
                for p in plugins
            ],
            "kernels": [
                {"name": e.cls.name, "format": e.cls.format, "op": e.cls.op, "priority": e.cls.priority,
                 "devices": sorted(e.cls.requires.device_types), "plugin": e.plugin}
                for e in kernels
            ],
            "failures": [
                {"format": fmt, "op": op, "kernel": kernel, "device": device, "reason": why}
                for (fmt, op, kernel, device), why in sorted(failures.items())
            ],
        },
        args.json,
    )
    return 0
