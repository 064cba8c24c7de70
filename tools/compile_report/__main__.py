"""``python -m tools.compile_report KERNEL [--sass DIR] [--all]``: see the package docstring."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import KERNELS, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.compile_report",
                                     description="compile a Triton kernel for sm_90a and report what the compiler made")
    parser.add_argument("kernel", choices=sorted(KERNELS))
    parser.add_argument("--sass", type=Path, metavar="DIR", help="also write each variant's SASS into DIR")
    parser.add_argument("--all", action="store_true", help="every variant (turboquant_triton: two-pass kernels too)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU target")
    json.dump(report(args.kernel, sass_dir=args.sass, everything=args.all), sys.stdout, default=str, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
