"""Entry point of the ``quantcore`` command.

The core's commands (list, doctor, explain) live in this package; the layers above the
core contribute theirs through the ``quantcore.commands`` entry-point group (the
conformance matrix's ``conformance``, the benchmark framework's ``bench``), so the core
never imports them. A command is a module with ``HELP`` (one line), ``add_arguments(parser)``
and ``run(args) -> int``.

Exit codes: 0 done; 1 the command's own negative answer (a conformance FAIL, no kernel
can run); 2 a usage error, printed as one line.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

__all__ = ["COMMAND_GROUP", "build_parser", "main"]

COMMAND_GROUP = "quantcore.commands"
DESCRIPTION = (
    "Quantized-weight formats, their kernels chosen per device, and the conformance matrix "
    "that proves them. Run 'quantcore COMMAND --help' for a command's options."
)
_BUILTIN = {"list": "quantcore.cli.list_cmd", "doctor": "quantcore.cli.doctor", "explain": "quantcore.cli.explain"}


class UsageError(Exception):
    """An argument error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, with errors as one line (``quantcore explain: error: ...``), not a usage dump."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message} (see '{self.prog} --help')")


def _commands() -> tuple[dict[str, ModuleType], dict[str, str]]:
    """Loaded command modules by name, and the commands that failed to load, with why."""
    modules = {name: importlib.import_module(path) for name, path in _BUILTIN.items()}
    broken: dict[str, str] = {}
    for ep in sorted(importlib.metadata.entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        if ep.name in modules:
            continue
        try:
            modules[ep.name] = ep.load()
        except Exception as exc:  # a broken command breaks only itself
            broken[ep.name] = f"{ep.value}: {type(exc).__name__}: {exc}"
    return modules, broken


def build_parser(commands: dict[str, ModuleType] | None = None) -> argparse.ArgumentParser:
    commands = _commands()[0] if commands is None else commands
    parser = _Parser(prog="quantcore", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name, module in commands.items():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        p.add_argument("--json", metavar="PATH", help="also write the result as JSON (- for stdout only)")
        module.add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from ..errors import QuantCoreError

    argv = list(sys.argv[1:] if argv is None else argv)
    commands, broken = _commands()
    if argv and argv[0] in broken:
        print(f"quantcore {argv[0]}: the command failed to load ({broken[argv[0]]})", file=sys.stderr)
        return 2
    try:
        args = build_parser(commands).parse_args(argv)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        return int(commands[args.command].run(args))
    except (QuantCoreError, UsageError) as exc:
        print(f"quantcore {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `quantcore list | head`
        sys.stderr.close()
        return 0
    except OSError as exc:  # a path the user named: unreadable, a directory, no space left
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"quantcore {args.command}: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2



if __name__ == "__main__":
    sys.exit(main())
