"""Progress of a long command on stderr, with an ETA: a tqdm bar on a terminal; in a log
(CI, a pipe) one line per tenth of the run, so the log stays short and still says how
long is left.

The ETA is shown once it means something: the first step carries the run's warm-up
(imports, compilation, the first golden reference), so the rate is measured from the
end of the first step, and only once a twentieth of the run (at least
:data:`MIN_STEPS` steps) has gone by since. Before that the line says nothing about
what is left rather than something wrong (extrapolated from a first step that holds the
warm-up, a six-minute run announces a day).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

__all__ = ["MIN_SHARE", "MIN_STEPS", "Progress"]

#: The share of the run, and the number of steps, timed before an ETA is shown.
MIN_SHARE = 0.05
MIN_STEPS = 2

_BAR = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


class Progress:
    def __init__(self, total: int | None, unit: str, *, file: TextIO | None = None, enabled: bool = True,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.total, self.unit, self.enabled = total, unit, enabled
        self.file = file if file is not None else sys.stderr
        self.done = 0
        self._clock = clock
        self._start = clock()
        self._first: float | None = None  # when the first step ended
        self._bar: Any = None
        self._next_line = 0
        if enabled and self.file.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit=f" {unit}", file=self.file, dynamic_ncols=True, leave=False,
                             bar_format=_BAR if total else None)

    def eta(self) -> float | None:
        """Seconds left, once enough of the run after its first step is timed; else None."""
        if not self.total or self._first is None:
            return None
        timed = self.done - 1
        if timed < max(MIN_STEPS, math.ceil(self.total * MIN_SHARE)):
            return None
        return (self._clock() - self._first) / timed * (self.total - self.done)

    def step(self, label: str = "") -> None:
        self.done += 1
        if self._first is None:
            self._first = self._clock()
        if not self.enabled:
            return
        if self._bar is not None:
            eta = self.eta()
            postfix = (f"ETA {_seconds(eta)}, " if eta is not None else "") + label[-48:]
            self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(1)
        elif self.done >= self._next_line or self.done == self.total:
            print(self._line(label), file=self.file, flush=True)
            self._next_line = self.done + max(1, (self.total or 10) // 10)

    def _line(self, label: str) -> str:
        elapsed = self._clock() - self._start
        if self.total:
            eta = self.eta()
            left = f", ETA {eta:.0f}s" if eta is not None else ""
            return f"[{self.done}/{self.total} {self.unit}] {elapsed:.0f}s{left}  {label}"
        return f"[{self.done} {self.unit}] {elapsed:.0f}s  {label}"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _seconds(s: float) -> str:
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f} min"
