"""``quantcore bench SUITE``: time kernels against their peers and the device's ceilings.
Contributed to the ``quantcore`` command through the ``quantcore.commands`` entry point.

Results (the suite's JSON and the device's Markdown page) go to ``bench/`` in quantcore's
cache folder unless ``--out DIR`` names another; ``--save`` writes them into the
repository's committed ``benchmarks/results/`` (run from the repository root). A plain run
never rewrites a tracked file."""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from quantcore.cli.arguments import check_device
from quantcore.cli.output import emit_json
from quantcore.errors import InvalidArgumentError
from quantcore.timing import GRAPH_CALLS

HELP = "time kernels against their peers and the device's measured ceilings"
#: The committed results, relative to the repository root.
COMMITTED = "benchmarks/results"


def results_folder(args: argparse.Namespace) -> Path | None:
    """Where this run writes its results: ``--out``, the committed folder with ``--save``,
    else the user's cache; None with ``--no-save``."""
    if args.no_save:
        return None
    if args.save:
        folder = Path(COMMITTED)
        if not folder.is_dir():
            raise InvalidArgumentError(f"--save: expected the repository root as the current folder (with "
                                       f"{COMMITTED}/), got {Path.cwd()}; or name a folder with --out DIR")
        return folder
    if args.out:
        return Path(args.out)
    from quantcore.measured import cache_dir

    return cache_dir() / "bench"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", nargs="?", help="suite name, or all; omit to list the suites")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shapes", default="default",
                        help="named shape sets of the suite, comma-separated (default, decode, prefill, sweep…)")
    parser.add_argument("--shape", action="append", metavar="M=1,K=4096,N=4096", help="explicit shape (repeatable)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds; each variant keeps the median")
    parser.add_argument("--graph", action="store_true",
                        help="CUDA: time CUDA-graph replays (no host launch cost), as decode runs in serving")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="DIR",
                       help="results folder (JSON and the device's .md page); default: bench/ in quantcore's cache "
                            "folder ($QUANTCORE_CACHE, ~/.cache/quantcore)")
    where.add_argument("--save", action="store_true",
                       help=f"write the results into the repository's committed {COMMITTED}/ (from the repository root)")
    where.add_argument("--no-save", action="store_true", help="do not write results")
    parser.add_argument("--plot", metavar="PNG", help="also plot time against M (needs matplotlib)")
    parser.add_argument("--remeasure", action="store_true", help="measure the device's ceilings again")


#: Dims that are sizes, never 0 (R, a LoRA rank, may be; flags such as ``fp16`` are 0 or 1).
_SIZES = ("M", "K", "N", "E", "T", "topk")


def parse_shape(text: str, required: Sequence[str] = (), optional: Sequence[str] = ()) -> dict[str, int]:
    """``M=1,K=4096,N=4096`` → ``{"M": 1, …}``; with ``required``, every one of those and
    nothing but them and ``optional``."""
    example = ",".join(f"{d}={v}" for d, v in zip(required or "MKN", (1, 4096, 4096, 8, 2), strict=False))
    try:
        shape = {k.strip(): int(v) for k, v in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise InvalidArgumentError(f"--shape: expected e.g. {example}, got {text!r}") from None
    if required:
        missing = [d for d in required if d not in shape]
        extra = sorted(set(shape) - set(required) - set(optional))
        if missing or extra:
            why = "; ".join(filter(None, (missing and f"missing {', '.join(missing)}",
                                           extra and f"{', '.join(extra)} unknown")))
            also = f"; optionally {', '.join(optional)}" if optional else ""
            raise InvalidArgumentError(
                f"--shape {text}: this suite takes {', '.join(required)} ({why}){also}, e.g. {example}")
    from quantcore.problem import MAX_DIM

    bad = [f"{k}={v}" for k, v in shape.items() if not 0 <= v <= MAX_DIM or (v == 0 and k in _SIZES)]
    if bad:
        raise InvalidArgumentError(f"--shape {text}: sizes are integers in [1, {MAX_DIM}] (a LoRA rank R or a flag "
                                   f"may be 0), got {', '.join(bad)}")
    return shape


#: The dims of a shape that size the weights a suite builds (the others size activations).
_WEIGHT_DIMS = ("E", "K", "N", "R")


def check_shape_fits(shape: dict[str, int], device: str) -> None:
    """Refuse, before any allocation, a shape whose weights could not be held here."""
    from quantcore.tuning import BYTES_PER_WEIGHT, memory_bytes

    weight = 1
    for dim in _WEIGHT_DIMS:
        weight *= shape.get(dim, 1)
    need, have = weight * BYTES_PER_WEIGHT, memory_bytes(device)
    if need > have // 2:
        said = ",".join(f"{k}={v}" for k, v in shape.items())
        raise InvalidArgumentError(f"--shape {said}: its weights need about {need / 2**30:.3g} GiB, more than half of "
                                   f"the {have / 2**30:.3g} GiB this {device} has")


def suite_dims(suite: ModuleType) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the dims every shape of the suite names, those only some name)."""
    shapes = [s for group in suite.SHAPES.values() for s in group]
    every = [d for d in shapes[0] if all(d in s for s in shapes)]
    some = sorted({d for s in shapes for d in s} - set(every))
    return tuple(every), tuple(some)


def run(args: argparse.Namespace) -> int:
    import torch

    from quantcore.probe import probe

    from . import report
    from .ceilings import ceilings
    from .choice import check
    from .runner import run_cases
    from .suites import available, get_suite

    if args.suite is None:
        for name in available():
            print(f"{name:20} {get_suite(name).DESCRIPTION}")
        return 0
    if args.suite == "all":
        codes = []
        for name in available():
            plot = args.plot and str(Path(args.plot).with_name(f"{Path(args.plot).stem}-{name}.png"))
            codes.append(run(argparse.Namespace(**{**vars(args), "suite": name, "plot": plot})))
        return max(codes)
    if args.rounds < 1:
        raise InvalidArgumentError(f"--rounds: expected a positive number of rounds, got {args.rounds}")
    suite = get_suite(args.suite)
    out = results_folder(args)
    if args.shape:
        shapes = [parse_shape(s, *suite_dims(suite)) for s in args.shape]
    else:
        shapes = []
        for name in args.shapes.split(","):
            if name not in suite.SHAPES:
                raise InvalidArgumentError(f"--shapes: expected one of {sorted(suite.SHAPES)}, got {name!r}")
            shapes += [s for s in suite.SHAPES[name] if s not in shapes]
    check_device(args.device)
    for shape in shapes:
        check_shape_fits(shape, args.device)
    caps = probe(args.device)
    ceil = ceilings(args.device, remeasure=args.remeasure)
    # Suites that time subprocesses or side streams opt out of graph capture.
    graph = bool(getattr(args, "graph", False)) and args.device.startswith("cuda") and getattr(suite, "GRAPH_SAFE", True)
    rows = run_cases(suite.cases(args.device, shapes), args.device, ceil, rounds=args.rounds, graph=graph,
                     graph_calls=getattr(suite, "GRAPH_CALLS", GRAPH_CALLS),
                     total=len(shapes))
    notes = suite.summarize(rows) if hasattr(suite, "summarize") else []
    choice_notes, default_check = check(rows)
    notes += choice_notes
    meta = {
        "suite": args.suite,
        "device": args.device,
        "device_name": caps.name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "date": datetime.date.today().isoformat(),
        "rounds": args.rounds,
        "timing": "cuda-graph replay" if graph else "eager",
        "ceilings": ceil.__dict__,
        "notes": notes,
        **({"default_check": default_check} if default_check else {}),
    }
    if args.json != "-":
        print(f"\n{args.suite} on {caps.name} — copy {ceil.copy_bytes_per_s / 1e9:.1f} GB/s, "
              f"{ceil.matmul_what} {ceil.matmul_flops_per_s / 1e12:.2f} TFLOP/s\n")
        print(report.table(rows))
        for note in notes:
            print("  " + note)
    if out is not None:
        device_dir = out / report.device_slug(caps.name)
        report.write_json(device_dir / f"{args.suite}.json", rows, meta)
        page = device_dir.with_suffix(".md")
        page.write_text(report.markdown_page(device_dir))
        print(f"\nwrote {device_dir / (args.suite + '.json')} and {page}", file=sys.stderr)
    if args.plot:
        report.plot(rows, Path(args.plot), f"{args.suite} on {caps.name}")
    emit_json({**meta, "rows": rows}, args.json)
    return 0
