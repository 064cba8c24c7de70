"""``quantcore doctor``: what every device type offers here, as probed."""

from __future__ import annotations

import argparse
import platform
import sys

from tabulate import tabulate

from ..probe import KNOWN_DEVICE_TYPES, probe
from .output import emit_json

HELP = "what each device offers, as probed"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", action="append", help="probe only these (repeatable)")


def run(args: argparse.Namespace) -> int:
    devices = args.device or list(KNOWN_DEVICE_TYPES)
    caps = [probe(d) for d in devices]
    if args.json != "-":
        print(f"python {sys.version.split()[0]} on {platform.platform()}")
        for c in caps:
            print(f"\n{c.device}")
            print(tabulate(c.as_rows(), tablefmt="plain"))
    emit_json([{"device": c.device, **dict(c.as_rows())} for c in caps], args.json)
    return 0
