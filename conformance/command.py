"""``quantcore conformance``: run the matrix on a device and print it as a table.
Contributed to the ``quantcore`` command through the ``quantcore.commands`` entry point."""

from __future__ import annotations

import argparse
import time

from quantcore.cli.output import emit_json

HELP = "run the conformance matrix on a device and print it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, xpu, npu: one present here (default cpu)")
    parser.add_argument("--profile", default="ci", choices=("ci", "full"))
    parser.add_argument("--backend", action="append", default=[], help="only these kernels/plugins (repeatable)")
    parser.add_argument("--format", action="append", default=[],
                        help="only these formats, by name (gptq) or a case's slug (gptq4-g128-asym) (repeatable)")
    parser.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                        help="worker processes for a CPU run (default: one per CPU; 1 runs in this process)")
    parser.add_argument("--group", default="family", choices=("family", "format"),
                        help="summary rows: one per family (gptq4, awq4, …; the default) or every format variant")
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--matrix", action="store_true",
                      help="the summary as formats × kernels, one column per kernel (wide)")
    view.add_argument("--detail", action="store_true", help="one row per cell instead of the summary")


def run(args: argparse.Namespace) -> int:
    from quantcore.cli.arguments import check_device

    from .filters import check_filters, no_cells_message

    device = check_device(args.device)
    # Before anything imports triton: on a CPU run, Triton cells use the interpreter.
    from .interpreter import enable_interpreter_for

    enable_interpreter_for(device)
    from quantcore.cli.progress import Progress
    from quantcore.errors import InvalidArgumentError
    from quantcore.probe import probe

    from .parallel import default_jobs, run_cells
    from .report import counts, detail_table, summary_table
    from .runner import collect_cells

    check_filters(args.format, args.backend)
    cells = collect_cells(profile=args.profile, formats=args.format, kernels=args.backend)
    if not cells:
        raise InvalidArgumentError(no_cells_message(args.format, args.backend))
    jobs = default_jobs() if args.jobs is None else args.jobs
    if jobs < 1:
        raise InvalidArgumentError(f"--jobs: expected 1 or more, got {jobs}")
    start = time.perf_counter()
    with Progress(len(cells), "cells") as progress:
        results = run_cells(cells, device, jobs=jobs, done=lambda cell, result: progress.step(cell.id))
    if args.json != "-":
        print(f"quantcore conformance on {device} (profile {args.profile}, {len(cells)} cells, "
              f"{time.perf_counter() - start:.0f}s)\n")
        if args.detail:
            print(detail_table(results))
        else:
            print(summary_table(results, group=args.group, layout="matrix" if args.matrix else "list"))
    caps = probe(device)
    meta = {"profile": args.profile, "device_name": caps.name, "torch": caps.torch_version}
    emit_json({"device": device, **meta, "counts": counts(results),
               "cells": [r.as_dict() for r in results]}, args.json)
    return 1 if counts(results)["FAIL"] else 0
