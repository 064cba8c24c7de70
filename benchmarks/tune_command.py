"""``quantcore tune``: measure every kernel that can run the given problems on this device,
store the times in this machine's cache, and with ``--export`` write them as a table to ship
inside the package (``quantcore/tables/<device>.json``), which ``get_kernel`` then uses
before the kernels' declared costs. Contributed to the ``quantcore`` command through the
``quantcore.commands`` entry point, beside ``bench``, whose suites' shape grids it reads:

    quantcore tune --suite gptq_linear,awq_linear --shapes default,sweep,prefill --device cuda --graph \\
        --export quantcore/tables/nvidia-h100-80gb-hbm3.json
    quantcore tune gptq -p bits=4 -p group_size=128 -K 4096 -N 11008 -M 1,16,256 --device cuda
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quantcore.cli.output import emit_json
from quantcore.errors import InvalidArgumentError

HELP = "measure the kernels for problems on this device; cache the times, export them as a shipped table"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", nargs="?", help="format name (with -p, -M/-K/-N or --dim); or use --suite")
    parser.add_argument("--suite", help="bench suites whose shape grids to tune, comma-separated")
    parser.add_argument("--shapes", default="default", help="the suites' named shape sets, comma-separated")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="format parameter")
    parser.add_argument("-M", default="", help="batch sizes, comma-separated (e.g. 1,16,256)")
    parser.add_argument("-K", type=int)
    parser.add_argument("-N", type=int)
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE", help="another problem dim")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--graph", action="store_true", help="CUDA: time CUDA-graph replays, as decode runs in serving")
    parser.add_argument("--fresh", action="store_true", help="measure again even where the cache has the times")
    parser.add_argument("--export", metavar="PATH", help="also write (merge into) a table to ship for this device")


def _problems(args: argparse.Namespace) -> list[Any]:
    from quantcore.api import get_format
    from quantcore.cli.explain import parse_params
    from quantcore.dtypes import parse_dtype
    from quantcore.problem import Problem

    from .suites import get_suite

    if args.suite:
        out: list[Any] = []
        for name in args.suite.split(","):
            suite = get_suite(name)
            if not hasattr(suite, "problems"):
                raise InvalidArgumentError(f"--suite: {name} times no kernel problems (it has no problems())")
            shapes: list[dict[str, int]] = []
            for set_name in args.shapes.split(","):
                if set_name not in suite.SHAPES:
                    continue  # not every suite names every set
                shapes += [s for s in suite.SHAPES[set_name] if s not in shapes]
            out += suite.problems(shapes)
        return out
    if not args.format:
        raise InvalidArgumentError("format: give a format (and its dims) or --suite")
    fmt = get_format(args.format, **parse_params(args.param))
    dims = {k: v for k, v in (("K", args.K), ("N", args.N)) if v is not None}
    for key, value in parse_params(args.dim).items():
        dims[key] = _integer(f"--dim {key}", value)
    batches = [_integer("-M", m) for m in args.M.split(",") if m.strip()] or [None]
    return [Problem.of(fmt, {**dims, **({"M": m} if m is not None else {})}, parse_dtype(args.dtype))
            for m in batches]


def _integer(option: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise InvalidArgumentError(f"{option}: expected an integer, got {text.strip()!r}") from None


def run(args: argparse.Namespace) -> int:
    from quantcore import measured
    from quantcore.probe import normalize_device, probe
    from quantcore.registry import default_registry
    from quantcore.selection import explain
    from quantcore.tuning import tuned

    if args.export and Path(args.export).is_dir():
        raise InvalidArgumentError(f"--export {args.export}: a directory; expected the path of the table to write")
    problems = _problems(args)
    device = normalize_device(args.device)
    caps = probe(device)
    if not caps.available:
        print(f"quantcore tune: {device}: {caps.reason}", file=sys.stderr)
        return 2
    reg = default_registry()
    entries: dict[str, measured.Measurement] = {}
    report = []
    weights: dict[str, Any] = {}
    for i, problem in enumerate(problems, 1):
        expl = explain(problem.format, device, problem=problem, registry=reg)
        names = [c.kernel for c in expl.candidates if c.status in ("selected", "usable")]
        if not names:
            print(f"[{i}/{len(problems)}] {problem.describe()}: no kernel can run it here", file=sys.stderr)
            continue
        result = tuned(problem, device, names, reg, graph=args.graph, fresh=args.fresh, weights=weights)
        entry = measured.Measurement(result.seconds, result.refused, result.timing, measured.versions())
        entries[measured.entry_key(problem)] = entry
        if args.export:  # as it goes: a run cut short keeps what it measured
            measured.export(Path(args.export), caps.name, {measured.entry_key(problem): entry})
        after = explain(problem.format, device, problem=problem, registry=reg)
        times = "  ".join(f"{k} {v * 1e6:.1f}" for k, v in sorted(result.seconds.items(), key=lambda kv: kv[1]))
        chosen = after.selected.kernel if after.selected else None
        print(f"[{i}/{len(problems)}] {problem.describe()}: {times} µs -> default {chosen}"
              + (f"; refused {sorted(result.refused)}" if result.refused else ""), file=sys.stderr, flush=True)
        report.append({"problem": problem.describe(), "seconds": result.seconds, "refused": result.refused,
                       "timing": result.timing, "default": chosen})
    if args.export:
        print(f"wrote {len(entries)} entries for {caps.name} to {args.export}", file=sys.stderr)
    emit_json({"device": device, "device_name": caps.name, "entries": report}, args.json)
    return 0
