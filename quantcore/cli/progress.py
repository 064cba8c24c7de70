"""Progress of a long command on stderr, with an ETA: a tqdm bar on a terminal; in a log
(CI, a pipe) one line per tenth of the run, so the log stays short and still says how
long is left."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(self, total: int | None, unit: str, *, file: TextIO | None = None, enabled: bool = True) -> None:
        self.total, self.unit, self.enabled = total, unit, enabled
        self.file = file if file is not None else sys.stderr
        self.done = 0
        self._start = time.perf_counter()
        self._bar: Any = None
        self._next_line = 0
        if enabled and self.file.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit=f" {unit}", file=self.file, dynamic_ncols=True, leave=False)

    def step(self, label: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(label[-48:], refresh=False)
            self._bar.update(1)
        elif self.done >= self._next_line or self.done == self.total:
            print(self._line(label), file=self.file, flush=True)
            self._next_line = self.done + max(1, (self.total or 10) // 10)

    def _line(self, label: str) -> str:
        elapsed = time.perf_counter() - self._start
        if self.total:
            eta = elapsed / self.done * (self.total - self.done)
            return f"[{self.done}/{self.total} {self.unit}] {elapsed:.0f}s, ETA {eta:.0f}s  {label}"
        return f"[{self.done} {self.unit}] {elapsed:.0f}s  {label}"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
