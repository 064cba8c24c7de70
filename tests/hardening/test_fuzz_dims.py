"""Sizes that cannot be: negative, beyond any model (``2^40``), not integers (strings,
floats, bools, None), and those that can but that no machine could tune or bench
(``K = N = 2^24``), through every door a size comes in: ``Problem``, ``get_kernel`` and
``explain`` (with and without ``tune=True``), a module skeleton, ``quantcore explain``,
``quantcore tune`` and ``quantcore bench --shape``.

Each is refused with an :class:`~quantcore.errors.InvalidArgumentError` naming the dim,
the argument or the option, before anything of that size is allocated (the op
harnesses that draw weights are watched: none may be asked for such a problem); the
command line exits 2 with one line. Sizes that can be are taken.
"""

from __future__ import annotations

import argparse
import io
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantcore.cli.main import main
from quantcore.errors import InvalidArgumentError, NoKernelError
from quantcore.formats.gptq import GPTQ
from quantcore.nn.linear import QuantLinear
from quantcore.ops import get_op
from quantcore.problem import MAX_DIM, Problem
from quantcore.selection import explain, get_kernel
from quantcore.tuning import BYTES_PER_WEIGHT, check_fits, memory_bytes

from .fuzz.profiles import examples
from .fuzz.seeds import registry
from .fuzz.tally import attempt

FMT = GPTQ(group_size=32, sym=False)
SMALL = (1, 2, 32, 64, 128, 256)
IMPOSSIBLE = (-1, -128, MAX_DIM + 1, 2**40, 2**63)
NOT_INTEGERS = ("128", "abc", 1.5, 128.0, True, None)
HUGE = (MAX_DIM,)
SIZES = st.one_of(st.sampled_from(SMALL), st.sampled_from(IMPOSSIBLE + HUGE), st.sampled_from(NOT_INTEGERS),
                  st.sampled_from((np.int64(64),)))


def fits(weight_elements: int) -> bool:
    """Whether this machine could hold a weight that large for measuring (the tuner's rule)."""
    return weight_elements * BYTES_PER_WEIGHT <= memory_bytes("cpu") // 2


def valid(v: Any) -> bool:
    return not isinstance(v, bool) and hasattr(v, "__index__") and 0 <= int(v) <= MAX_DIM


def valid_text(v: Any) -> bool:
    """What a command line makes of ``str(v)``: an integer in range, or not."""
    text = str(v).strip()
    return text.lstrip("-").isdigit() and 0 <= int(text) <= MAX_DIM


@pytest.fixture(autouse=True)
def watched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The linear harness refuses to draw weights for a problem too large to hold."""
    harness = type(get_op("linear").harness)
    draw = harness.weights

    def weights(self: Any, case: Any) -> Any:
        elements = 1
        for d in get_op(case.op).weight_dims:
            elements *= case.problem.get(d) or 1
        assert fits(elements), f"weights of {elements} elements were drawn for {case.id}"
        return draw(self, case)

    monkeypatch.setattr(harness, "weights", weights)


def cli(argv: list[str]) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        code = main(argv)
    return code, err.getvalue()


def one_line_exit_2(result: tuple[int, str]) -> str | None:
    code, err = result
    if code != 2 or err.count("\n") != 1 or "Traceback" in err:
        return f"exit {code}, stderr {err!r:.300}"
    return None


@settings(max_examples=examples("fast"))
@given(m=SIZES, k=SIZES, n=SIZES, door=st.sampled_from((
    "Problem", "get_kernel", "explain", "get_kernel tune", "explain tune", "skeleton", "quantcore explain",
    "quantcore tune", "quantcore bench --shape")))
def test_impossible_sizes_are_refused_before_allocation(m: Any, k: Any, n: Any, door: str) -> None:
    dims = {"M": m, "K": k, "N": n}
    read = ("K", "N") if door == "skeleton" else tuple(dims)  # a module skeleton has no batch dim
    check = valid_text if door.startswith("quantcore ") else valid  # a command line reads text
    ok = all(check(dims[d]) for d in read)
    names = ("M", "K", "N", "in_features", "out_features", "problem", "--shape", "-M", "-K", "-N", "--dim")
    huge = ok and not fits(int(str(k)) * int(str(n)))

    def problem() -> Problem:
        return Problem.of(FMT, dims, torch.float32)

    def act() -> Any:
        if door == "Problem":
            return problem()
        if door in ("get_kernel", "explain"):
            fn = get_kernel if door == "get_kernel" else explain
            return fn(FMT, "cpu", problem=problem(), registry=registry())
        if door.endswith("tune"):
            p = problem()
            if not huge:  # a real measurement is not what this test is for: only what it refuses
                check_fits(p, "cpu")
                return p
            fn = get_kernel if door == "get_kernel tune" else explain
            return fn(FMT, "cpu", problem=p, tune=True, registry=registry())
        if door == "skeleton":
            return QuantLinear(FMT, in_features=k, out_features=n, device="meta")
        text = {"M": m, "K": k, "N": n}
        if door == "quantcore explain":
            return cli(["explain", "gptq", "-p", "group_size=32", "-p", "sym=false",
                        *(x for d, v in text.items() for x in (f"-{d}", str(v)))])
        if door == "quantcore tune":
            from quantcore.benchmarks.tune_command import _problems

            args = argparse.Namespace(suite=None, format="gptq", param=["group_size=32"], M=str(m),
                                      K=None, N=None, dim=[f"K={k}", f"N={n}"], dtype="fp32", shapes="default")
            return _problems(args)
        from quantcore.benchmarks.command import check_shape_fits, parse_shape

        shape = parse_shape(",".join(f"{d}={v}" for d, v in text.items()), ("M", "K", "N"))
        check_shape_fits(shape, "cpu")
        return shape

    def judge(result: Any) -> str | None:
        if door == "quantcore explain":  # explains, measures nothing: any size it can read is taken
            if ok:
                return None if result[0] in (0, 1) else f"exit {result[0]}: {result[1]!r:.200}"
            return one_line_exit_2(result)
        if not ok:
            return f"took {dims}"
        if huge and door in ("get_kernel tune", "explain tune", "quantcore bench --shape"):
            return f"took {dims} for measuring"
        return None

    attempt(f"dims:{door}", act, names=names, judge=judge, unnamed=(NoKernelError,),
            context=f"{door} with M={m!r}, K={k!r}, N={n!r}")


def test_a_dim_named_twice_or_not_a_mapping_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="problem dims"):
        Problem.of(FMT, [("K", 1), ("K", 2)], torch.float32)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="problem dims"):
        Problem.of(FMT, 5, torch.float32)  # type: ignore[arg-type]
