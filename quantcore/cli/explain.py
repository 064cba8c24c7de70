"""``quantcore explain FORMAT [DEVICE]``: every candidate kernel, chosen or refused, and why."""

from __future__ import annotations

import argparse

from ..api import get_format
from ..dtypes import parse_dtype
from ..errors import InvalidArgumentError
from ..problem import Problem
from ..selection import explain
from .output import emit_json

HELP = "every candidate kernel for a format on a device, chosen or refused, and why"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("format", help="format name, e.g. gptq")
    parser.add_argument("device", nargs="?", default="cpu", help="cpu, cuda, cuda:1, xpu, npu (default cpu)")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                        help="format parameter, e.g. -p bits=4 -p group_size=128")
    for dim in ("M", "K", "N"):
        parser.add_argument(f"-{dim}", type=int, help=f"problem dim {dim}")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                        help="another problem dim (a MoE's T, E, topk; SVDQuant's R)")
    parser.add_argument("--dtype", default="bf16", help="activation dtype (bf16, fp16, fp32)")
    parser.add_argument("--prefer", action="append", help="kernel names to try first")
    parser.add_argument("--allow-dense", action="store_true",
                        help="let kernels that keep a dense copy of the weight compete on time")
    parser.add_argument("--tune", action="store_true",
                        help="measure the usable kernels on this device (cached) and show their times")


def parse_params(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidArgumentError(f"--param: expected key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def run(args: argparse.Namespace) -> int:
    fmt = get_format(args.format, **parse_params(args.param))
    dims = {k: v for k, v in (("M", args.M), ("K", args.K), ("N", args.N)) if v is not None}
    for name, value in parse_params(args.dim).items():
        try:
            dims[name] = int(value)
        except ValueError:
            raise InvalidArgumentError(f"--dim {name}: expected an integer, got {value!r}") from None
    problem = Problem.of(fmt, dims, parse_dtype(args.dtype)) if dims else None
    result = explain(fmt, args.device, problem=problem, prefer=args.prefer or None, tune=args.tune,
                     allow_dense=True if args.allow_dense else None)
    if args.json != "-":
        print(result.table())
    emit_json(result.as_dict(), args.json)
    return 0 if result.selected else 1
