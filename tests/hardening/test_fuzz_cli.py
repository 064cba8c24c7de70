"""The ``quantcore`` command given one bad argument: every command, every kind of fault.

Each example builds a command line that would run (``list``, ``doctor``, ``explain``,
``tune``, ``bench``, ``conformance``) and spoils one argument: a ``--json`` path that is a
folder or under a file, a number that is not one or is out of range (``--rounds 0``,
``-M abc``, ``-K -5``, ``--dim X=abc``, ``-j 0``), a shape, a format parameter, a device,
a suite or a format that does not exist, an ``--export`` path that is a folder. Each must
exit with status 2 and one line on stderr naming the argument, never a traceback, before
any measurement starts.
"""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore.cli.main import main

from .fuzz.profiles import examples
from .fuzz.tally import attempt

EXPLAIN = ["explain", "gptq", "-p", "group_size=128", "-M", "1", "-K", "256", "-N", "256"]
TUNE = ["tune", "gptq", "-p", "group_size=128", "-M", "1", "-K", "256", "-N", "256"]
BENCH = ["bench", "gptq_linear", "--shape", "M=1,K=256,N=256", "--no-save"]


def faults(folder: Path, file: Path) -> dict[str, tuple[list[str], str]]:
    """What to spoil: (argv, the argument its error must name)."""
    return {
        "list --json a folder": (["list", "--json", str(folder)], str(folder)),
        "doctor --json under a file": (["doctor", "--json", str(file / "x.json")], str(file / "x.json")),
        "doctor --device garbage": (["doctor", "--device", "cuda:x"], "device"),
        "explain --json a folder": ([*EXPLAIN, "--json", str(folder)], str(folder)),
        "explain -K negative": (["explain", "gptq", "-K", "-5", "-N", "256"], "K"),
        "explain -K huge": (["explain", "gptq", "-K", str(2**40), "-N", "256"], "K"),
        "explain -K text": (["explain", "gptq", "-K", "abc"], "-K"),
        "explain --dim text": ([*EXPLAIN, "--dim", "X=abc"], "--dim"),
        "explain --dim no value": ([*EXPLAIN, "--dim", "X"], "--param"),
        "explain param": (["explain", "gptq", "-p", "bits=x"], "bits"),
        "explain unknown param": (["explain", "gptq", "-p", "nope=1"], "nope"),
        "explain format": (["explain", "no_such_format"], "format"),
        "explain device": (["explain", "gptq", "cuda:x"], "device"),
        "explain dtype": ([*EXPLAIN, "--dtype", "int8"], "dtype"),
        "explain prefer": ([*EXPLAIN, "--prefer", "no_such_kernel"], "prefer"),
        "tune -M text": ([*TUNE[:5], "abc", *TUNE[6:]], "-M"),
        "tune --dim text": ([*TUNE, "--dim", "X=abc"], "--dim"),
        "tune -K huge": (["tune", "gptq", "-K", str(2**24), "-N", str(2**24), "-M", "1"], "problem"),
        "tune --export a folder": ([*TUNE, "--export", str(folder)], str(folder)),
        "tune no format": (["tune"], "format"),
        "tune suite": (["tune", "--suite", "no_such_suite"], "suite"),
        "bench --rounds 0": ([*BENCH, "--rounds", "0"], "--rounds"),
        "bench --rounds text": ([*BENCH, "--rounds", "x"], "--rounds"),
        "bench --shape text": (["bench", "gptq_linear", "--shape", "M=1,K=abc,N=256", "--no-save"], "--shape"),
        "bench --shape negative": (["bench", "gptq_linear", "--shape", "M=1,K=-256,N=256", "--no-save"], "--shape"),
        "bench --shape huge": (["bench", "gptq_linear", "--shape", f"M=1,K={2**24},N={2**24}", "--no-save"],
                               "--shape"),
        "bench --json a folder": ([*BENCH[:-1], "--json", str(folder), "--rounds", "0"], "--rounds"),
        "bench suite": (["bench", "no_such_suite"], "suite"),
        "bench --shapes": (["bench", "gptq_linear", "--shapes", "nope", "--no-save"], "--shapes"),
        "bench device": ([*BENCH, "--device", "tpu"], "--device"),
        "conformance format": (["conformance", "--format", "no_such_format"], "no_such_format"),
        "conformance backend": (["conformance", "--backend", "no_such_kernel"], "no_such_kernel"),
        "conformance device": (["conformance", "--device", "tpu"], "device"),
        "conformance -j": (["conformance", "-j", "x"], "-j"),
        "conformance --json a folder": (["conformance", "--format", "no_such_format", "--json", str(folder)],
                                        "no_such_format"),
        "unknown command": (["no_such_command"], "no_such_command"),
    }


@pytest.fixture(scope="module")
def places(tmp_path_factory: Any) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("cli")
    (root / "a_file").write_text("x")
    return root / "", root / "a_file"


FAULTS = sorted(faults(Path("/"), Path("/")))


@settings(max_examples=examples("fast"))
@given(fault=st.sampled_from(FAULTS))
def test_one_bad_argument_is_one_line_and_exit_2(fault: str, places: tuple[Path, Path]) -> None:
    argv, named = faults(*places)[fault]

    def run() -> tuple[int, str]:
        err, out = io.StringIO(), io.StringIO()
        with redirect_stderr(err), redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's --help; anything else is a failure
                code = exc.code if isinstance(exc.code, int) else 1
        return code, err.getvalue()

    def judge(result: tuple[int, str]) -> str | None:
        code, err = result
        lines = err.strip("\n").splitlines()
        if code != 2 or "Traceback" in err or len(lines) != 1:
            return f"exit {code}, stderr {err[-400:]!r}"
        if named not in lines[0]:
            return f"the error does not name {named!r}: {lines[0]!r}"
        return None

    attempt(f"cli:{argv[0]}", run, names=(), judge=judge, allow_refusal=False, timeout=120,
            context=" ".join(argv))
