"""Every generated case is classified, counted, and reported at the end of the run.

A case is one call of one entry point (a validator, a transform, a kernel's ``prepare``
or call, ...) on generated input. It ends in one of two ways:

``refused``  it raised quantcore's own error (:class:`~quantcore.errors.QuantCoreError`)
             and the message names a tensor or parameter of the call;
``handled``  it returned, and the result agrees with the golden reference.

Anything else fails the test at once, counted by kind: ``foreign`` (an exception that is
not quantcore's: ``RuntimeError``, ``IndexError``, ... from torch or Python internals),
``unnamed`` (a refusal that names nothing), ``wrong`` (a result that disagrees with the
golden: silently wrong), ``hang`` (no answer within the case's time limit). A crash of
the process takes its pytest-xdist worker down and is counted as such by the controller.

A target is ``category:name`` (``call:aten_cpu``, ``checkpoint:load_quantized``); the
report adds the counts by category.

The counts go to the terminal summary and to a JSON file (``QUANTCORE_FUZZ_REPORT``,
default ``.pytest_cache/quantcore-fuzz-<profile>.json``).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from quantcore.errors import QuantCoreError

__all__ = ["FAILURES", "HANDLED", "REFUSED", "TALLY", "FuzzFailure", "attempt", "names_in"]

HANDLED, REFUSED = "handled", "refused"
#: The ways a case fails its test, counted before the failure is raised.
FAILURES = ("foreign", "unnamed", "wrong", "hang")
ENV_REPORT = "QUANTCORE_FUZZ_REPORT"
_WORKER_KEY = "quantcore_fuzz_tally"


class FuzzFailure(AssertionError):
    """A generated case that was neither handled correctly nor refused properly."""


class Tally:
    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.failures: Counter[str] = Counter()
        self.crashes = 0
        self._lock = threading.Lock()

    def add(self, target: str, outcome: str) -> None:
        with self._lock:
            self.counts[(target, outcome)] += 1

    def fail(self, kind: str) -> None:
        with self._lock:
            self.failures[kind] += 1

    def merge(self, data: dict[str, Any]) -> None:
        for row in data.get("targets", []):
            for outcome in (HANDLED, REFUSED):
                self.counts[(row["target"], outcome)] += row[outcome]
        for kind in FAILURES:
            self.failures[kind] += data.get(kind, 0)
        self.crashes += data.get("crashes", 0)

    def total(self, outcome: str | None = None) -> int:
        return sum(n for (_, o), n in self.counts.items() if outcome is None or o == outcome)

    def as_dict(self) -> dict[str, Any]:
        targets = sorted({t for t, _ in self.counts})
        categories: Counter[tuple[str, str]] = Counter()
        for (target, outcome), n in self.counts.items():
            categories[(target.split(":")[0], outcome)] += n
        return {
            "cases": self.total(),
            "refused": self.total(REFUSED),
            "handled": self.total(HANDLED),
            "crashes": self.crashes,
            **{kind: self.failures[kind] for kind in FAILURES},
            "categories": [
                {"category": c, HANDLED: categories[(c, HANDLED)], REFUSED: categories[(c, REFUSED)]}
                for c in sorted({c for c, _ in categories})
            ],
            "targets": [
                {"target": t, HANDLED: self.counts[(t, HANDLED)], REFUSED: self.counts[(t, REFUSED)]}
                for t in targets
            ],
        }


TALLY = Tally()


def names_in(message: str, names: Iterable[str]) -> bool:
    """Whether ``message`` names one of ``names`` as a word (``scales``, ``x``, ``K``)."""
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", message) for n in names if n)


def attempt(
    target: str,
    fn: Callable[[], Any],
    *,
    names: Iterable[str],
    judge: Callable[[Any], str | None] | None = None,
    context: Callable[[], str] | str = "",
    allow_refusal: bool = True,
    unnamed: tuple[type[BaseException], ...] = (),
    timeout: float | None = None,
) -> tuple[str, Any]:
    """Run one case and classify it; ``judge(result)`` returns why a result is wrong, or
    None. Returns ``(outcome, result or the refusal)``; raises :class:`FuzzFailure`.
    ``unnamed``: quantcore errors whose message need not name a parameter (a
    ``NoKernelError`` is the explain table: every candidate, with its reason).
    ``timeout``: seconds the case may take before it counts as a hang (run in a thread)."""

    def ctx() -> str:
        return context() if callable(context) else context

    def failure(kind: str, message: str) -> FuzzFailure:
        TALLY.fail(kind)
        return FuzzFailure(f"{target}: {message}\n{ctx()}")

    names = list(names)
    try:
        value = fn() if timeout is None else _within(fn, timeout)
    except _Hang:
        raise failure("hang", f"no answer within {timeout} s") from None
    except QuantCoreError as exc:
        if not allow_refusal:
            raise failure("wrong", f"refused an input it must take: {type(exc).__name__}: {exc}") from exc
        if not isinstance(exc, unnamed) and not names_in(str(exc), names):
            raise failure("unnamed", f"refused with a message that names no tensor or parameter (expected one of "
                                     f"{sorted(set(names))}): {type(exc).__name__}: {exc}") from exc
        TALLY.add(target, REFUSED)
        return REFUSED, exc
    except FuzzFailure:
        raise
    except Exception as exc:
        raise failure("foreign", f"raised a foreign {type(exc).__name__}: {exc}") from exc
    if judge is not None:
        problem = judge(value)
        if problem:
            raise failure("wrong", f"silently wrong result: {problem}")
    TALLY.add(target, HANDLED)
    return HANDLED, value


class _Hang(Exception):
    pass


def _within(fn: Callable[[], Any], timeout: float) -> Any:
    """``fn()`` in a daemon thread; :class:`_Hang` when it has not returned in time (the
    thread is left behind: nothing can stop it, and the test fails)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise _Hang
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --- pytest plumbing (imported into tests/conftest.py, so the xdist controller has it) ---


def _report_path(config: pytest.Config) -> Path:
    from .profiles import PROFILE

    env = os.environ.get(ENV_REPORT)
    return Path(env) if env else Path(str(config.rootpath)) / ".pytest_cache" / f"quantcore-fuzz-{PROFILE}.json"


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[_WORKER_KEY] = json.dumps(TALLY.as_dict())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    raw = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
    if raw:
        TALLY.merge(json.loads(raw))
    if error:
        TALLY.crashes += 1


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if getattr(config, "workerinput", None) is not None or (not TALLY.counts and not TALLY.crashes):
        return
    from .profiles import PROFILE

    data = {"profile": PROFILE, **TALLY.as_dict()}
    path = _report_path(config)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
        where = f" (written to {path})"
    except OSError as exc:  # a read-only checkout still gets the summary
        where = f" (not written: {exc})"
    tr = terminalreporter
    tr.write_sep("=", f"quantcore fuzz, profile {PROFILE}")
    tr.write_line(
        f"cases run: {data['cases']}  refused: {data['refused']}  handled: {data['handled']}  "
        f"crashes: {data['crashes']}  " + "  ".join(f"{k}: {data[k]}" for k in FAILURES) + where
    )
    suites: Counter[tuple[str, str]] = Counter()
    for row in data["targets"]:
        suite = row["target"].split(":")[0]
        suites[(suite, HANDLED)] += row[HANDLED]
        suites[(suite, REFUSED)] += row[REFUSED]
    for suite in sorted({s for s, _ in suites}):
        tr.write_line(f"  {suite:<12} refused {suites[(suite, REFUSED)]:>6}  handled {suites[(suite, HANDLED)]:>6}")
