"""The README's test command is what CI runs, verbatim."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    marker = readme.index("# 2. the test suite (what CI runs, verbatim: .ci/run)")
    command = readme[marker + 1].strip()
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci, f".ci/run does not run the README's test command: {command}"
    assert command.endswith("python -m pytest -n auto --dist loadgroup")
