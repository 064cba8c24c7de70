"""``quantcore conformance``: run the matrix on a device and print it as a table.
Contributed to the ``quantcore`` command through the ``quantcore.commands`` entry point."""

from __future__ import annotations

import argparse
import sys
import time

from quantcore.cli.output import emit_json

HELP = "run the conformance matrix on a device and print it"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--profile", default="ci", choices=("ci", "full"))
    parser.add_argument("--backend", action="append", default=[], help="only these kernels/plugins")
    parser.add_argument("--format", action="append", default=[], help="only these formats (name or slug)")
    parser.add_argument("--detail", action="store_true", help="one row per cell instead of the summary")
    parser.add_argument("--group", default="format", choices=("format", "family"),
                        help="summary rows: every format variant, or one per family (gptq4, awq4, …)")


def run(args: argparse.Namespace) -> int:
    # Before anything imports triton: on a CPU run, Triton cells use the interpreter.
    from quantcore.conformance.interpreter import enable_interpreter_for

    enable_interpreter_for(args.device)
    from quantcore.conformance.report import counts, detail_table, summary_table
    from quantcore.conformance.runner import collect_cells, run_cell

    cells = collect_cells(profile=args.profile, formats=args.format, kernels=args.backend)
    if not cells:
        print("no conformance cells match these filters", file=sys.stderr)
        return 2
    results = []
    start = time.perf_counter()
    show = sys.stderr.isatty()
    for i, cell in enumerate(cells, 1):
        results.append(run_cell(cell, args.device))
        if show or i % 100 == 0 or i == len(cells):
            line = f"[{i}/{len(cells)}] {time.perf_counter() - start:5.0f}s {cell.id}"
            print(("\r" + line[:110].ljust(110)) if show else line, end="" if show else "\n", file=sys.stderr)
    if show:
        print(file=sys.stderr)
    if args.json != "-":
        print(f"quantcore conformance on {args.device} (profile {args.profile}, {len(cells)} cells, "
              f"{time.perf_counter() - start:.0f}s)\n")
        print(detail_table(results) if args.detail else summary_table(results, group=args.group))
    from quantcore.probe import probe

    caps = probe(args.device)
    meta = {"profile": args.profile, "device_name": caps.name, "torch": caps.torch_version}
    emit_json({"device": args.device, **meta, "counts": counts(results),
               "cells": [r.as_dict() for r in results]}, args.json)
    return 1 if counts(results)["FAIL"] else 0
