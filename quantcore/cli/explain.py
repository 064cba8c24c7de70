"""``quantcore explain FORMAT [DEVICE]``: every candidate kernel, chosen or refused, and why."""

from __future__ import annotations

import argparse

from ..api import get_format
from ..dtypes import parse_dtype
from ..problem import Problem
from ..selection import explain
from .output import emit_json


def parse_params(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--param: expected key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def run(args: argparse.Namespace) -> int:
    fmt = get_format(args.format, **parse_params(args.param))
    dims = {k: v for k, v in (("M", args.M), ("K", args.K), ("N", args.N)) if v is not None}
    problem = Problem.of(fmt, dims, parse_dtype(args.dtype)) if dims else None
    result = explain(fmt, args.device, problem=problem, prefer=args.prefer or None)
    if args.json != "-":
        print(result.table())
    emit_json(result.as_dict(), args.json)
    return 0 if result.selected else 1
