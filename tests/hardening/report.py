"""Run the fuzz and fault suites in one profile and print what they counted.

    python -m tests.hardening.report              # the nightly profile (> 20,000 cases)
    python -m tests.hardening.report --profile ci # what CI runs on every push (> 6,000)
    python -m tests.hardening.report --profile ci --json benchmarks/results/hardening/fuzz-ci-cpu.json

Runs ``pytest tests/hardening`` with ``QUANTCORE_FUZZ_PROFILE`` set (extra arguments go
to pytest, e.g. ``-n 4``), then prints cases run, refused, handled, crashes, hangs,
foreign exceptions, unnamed refusals and silently wrong results, and the counts by
category, from the report the run wrote (``fuzz/tally.py``). Exits non-zero if a test
failed, a worker crashed or any case failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .fuzz.tally import FAILURES

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.hardening.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="nightly", choices=("ci", "nightly"))
    parser.add_argument("--json", metavar="PATH", help="also keep the report here")
    args, pytest_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(args.json) if args.json else Path(tmp) / "fuzz.json"
        env = {**os.environ, "QUANTCORE_FUZZ_PROFILE": args.profile, "QUANTCORE_FUZZ_REPORT": str(report)}
        cmd = [sys.executable, "-m", "pytest", "tests/hardening", "-q", "-p", "no:cacheprovider", *pytest_args]
        rc = subprocess.call(cmd, cwd=REPO, env=env)
        if not report.exists():
            print("no fuzz report was written (did the run reach its end?)", file=sys.stderr)
            return rc or 1
        data = json.loads(report.read_text())
    failed = {kind: data.get(kind, 0) for kind in FAILURES}
    print(f"\nprofile {data['profile']}: cases run {data['cases']}, refused {data['refused']}, "
          f"handled {data['handled']}, crashes {data['crashes']}, "
          + ", ".join(f"{kind} {n}" for kind, n in failed.items()) + f"; pytest exit status {rc}")
    for row in data.get("categories", []):
        print(f"  {row['category']:<12} refused {row['refused']:>6}  handled {row['handled']:>6}")
    return rc or (1 if data["crashes"] or any(failed.values()) else 0)


if __name__ == "__main__":
    sys.exit(main())
