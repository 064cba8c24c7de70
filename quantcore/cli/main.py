"""Entry point of the ``quantcore`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quantcore", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--json", metavar="PATH", help="also write the result as JSON (- for stdout only)")
        return p

    add("list", "plugins, formats and kernels; broken plugins with their error")
    p = add("doctor", "what each device offers, as probed")
    p.add_argument("--device", action="append", help="probe only these (repeatable)")
    p = add("explain", "every candidate kernel for a format on a device, chosen or refused, and why")
    p.add_argument("format", help="format name, e.g. gptq")
    p.add_argument("device", nargs="?", default="cpu", help="cpu, cuda, cuda:1, xpu, npu (default cpu)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                   help="format parameter, e.g. -p bits=4 -p group_size=128")
    for dim in ("M", "K", "N"):
        p.add_argument(f"-{dim}", type=int, help=f"problem dim {dim}")
    p.add_argument("--dtype", default="bf16", help="activation dtype (bf16, fp16, fp32)")
    p.add_argument("--prefer", action="append", help="kernel names to try first")
    p = add("conformance", "run the conformance matrix on a device and print it")
    p.add_argument("--device", default="cpu")
    p.add_argument("--profile", default="ci", choices=("ci", "full"))
    p.add_argument("--backend", action="append", default=[], help="only these kernels/plugins")
    p.add_argument("--format", action="append", default=[], help="only these formats (name or slug)")
    p.add_argument("--detail", action="store_true", help="one row per cell instead of the summary")
    p.add_argument("--group", default="format", choices=("format", "family"),
                   help="summary rows: every format variant, or one per family (gptq4, awq4, …)")
    p = add("bench", "time kernels against their peers and the device's measured ceilings")
    p.add_argument("suite", nargs="?", help="suite name, or all; omit to list the suites")
    p.add_argument("--device", default="cpu")
    p.add_argument("--shapes", default="default", help="a named shape set of the suite (default, decode, prefill…)")
    p.add_argument("--shape", action="append", metavar="M=1,K=4096,N=4096", help="explicit shape (repeatable)")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds; each variant keeps the median")
    p.add_argument("--graph", action="store_true",
                   help="CUDA: time CUDA-graph replays (no host launch cost), as decode runs in serving")
    p.add_argument("--out", default="benchmarks/results", help="results folder (JSON and the device's .md page)")
    p.add_argument("--no-save", action="store_true", help="do not write results")
    p.add_argument("--plot", metavar="PNG", help="also plot time against M (needs matplotlib)")
    p.add_argument("--remeasure", action="store_true", help="measure the device's ceilings again")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        from .list_cmd import run
    elif args.command == "doctor":
        from .doctor import run
    elif args.command == "explain":
        from .explain import run
    elif args.command == "bench":
        from .bench import run
    else:
        from .conformance import run
    from ..errors import QuantCoreError

    try:
        return run(args)
    except QuantCoreError as exc:
        print(f"quantcore {args.command}: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `quantcore list | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
