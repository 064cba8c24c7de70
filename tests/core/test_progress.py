"""The progress line's ETA: none while it would be a guess, then the rate of the steps
after the first (which carries the warm-up)."""

from __future__ import annotations

import io

from quantcore.cli.progress import MIN_SHARE, Progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_no_eta_from_the_first_step_then_the_rate_after_it() -> None:
    clock, log = Clock(), io.StringIO()
    progress = Progress(100, "cells", file=log, clock=clock)
    clock.now = 300.0  # the first cell: imports, compilation, the golden
    progress.step("first")
    assert progress.eta() is None
    assert log.getvalue().splitlines()[0] == "[1/100 cells] 300s  first"  # no ETA, not 29,700 s
    for _ in range(4):
        clock.now += 1.0
        progress.step()
    assert progress.done - 1 < 100 * MIN_SHARE and progress.eta() is None  # 4 steps timed: too few
    for _ in range(6):
        clock.now += 1.0
        progress.step("tenth")
    assert progress.eta() == 89.0  # 10 steps in 10 s after the first, 89 to go
    assert log.getvalue().splitlines()[-1] == "[11/100 cells] 310s, ETA 89s  tenth"


def test_a_run_without_a_total_has_no_eta() -> None:
    clock, log = Clock(), io.StringIO()
    progress = Progress(None, "cases", file=log, clock=clock)
    for _ in range(30):
        clock.now += 2.0
        progress.step("c")
    assert progress.eta() is None and "ETA" not in log.getvalue()
    assert log.getvalue().splitlines()[0] == "[1 cases] 2s  c"
