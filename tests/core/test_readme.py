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


def test_readme_explain_example_is_what_the_command_prints() -> None:
    """The README's ``quantcore explain`` example, run after its own install command
    (which installs the example plugin), prints exactly that table."""
    import importlib.metadata
    import subprocess
    import sys

    import pytest

    names = {ep.name for ep in importlib.metadata.entry_points(group="quantcore")}
    if "example_zero_folding" not in names:
        pytest.skip("the example plugin (installed by the README's commands) is not installed")
    text = (ROOT / "README.md").read_text()
    start = text.index("$ quantcore explain ")
    block = text[start:text.index("```", start)].strip().splitlines()
    command, expected = block[0].removeprefix("$ quantcore ").split(), block[1:]
    out = subprocess.run([sys.executable, "-m", "quantcore", *command], capture_output=True, text=True,
                         timeout=300, env={k: v for k, v in __import__("os").environ.items()  # a user's shell
                                           if not k.startswith("QUANTCORE_") and k != "TRITON_INTERPRET"})
    assert [line.rstrip() for line in out.stdout.strip().splitlines()] == [line.rstrip() for line in expected]
