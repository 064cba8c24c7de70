"""The README and the docs run as written: the README's test command is what CI runs, every
Python block runs in a fresh interpreter on the CPU, and every ``quantcore explain`` example
prints what the page shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: Pages whose Python blocks another test runs, with what they need (transformers).
DOCS_RUN_ELSEWHERE = {"checkpoints.md": "tests/loading/test_docs.py"}
#: A newcomer reads the README in five minutes; the reference is in docs/.
README_MAX_LINES = 250
#: Seconds one block may take on a loaded 2-core machine (each takes a few CPU-seconds).
BLOCK_TIMEOUT_S = 300



def _blocks(page: Path) -> list[tuple[str, str]]:
    """``(language, text)`` of every fenced block of a Markdown page, in order."""
    blocks, language, lines = [], None, []
    for line in page.read_text().splitlines():
        if language is None and line.startswith("```"):
            language, lines = line[3:].strip(), []
        elif language is not None and line.strip() == "```":
            blocks.append((language, "\n".join(lines) + "\n"))
            language = None
        elif language is not None:
            lines.append(line)
    assert language is None, f"{page}: a code block is not closed"
    return blocks


def _python_blocks(page: Path) -> list[str]:
    return [text for language, text in _blocks(page) if language == "python"]


def _doc_pages() -> list[Path]:
    return sorted(p for p in (ROOT / "docs").rglob("*.md")
                  if p.name not in DOCS_RUN_ELSEWHERE and _python_blocks(p))


def _user_env() -> dict[str, str]:
    """A user's shell on a CPU-only machine with no network: no quantcore or Triton switches
    of the test run, no GPU, no downloads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUANTCORE_") and k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def _run_python(source: str, where: str, cwd: Path) -> None:
    out = subprocess.run([sys.executable, "-c", source], cwd=cwd, capture_output=True, text=True,
                         timeout=BLOCK_TIMEOUT_S, env=_user_env())
    assert out.returncode == 0, f"{where} failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"


def test_ci_runs_the_readme_test_command() -> None:
    readme = README.read_text().splitlines()
    marker = readme.index("# 2. the test suite (what CI runs, verbatim: .ci/run)")
    command = readme[marker + 1].strip()
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert command in ci, f".ci/run does not run the README's test command: {command}"
    assert command.endswith("python -m pytest -n auto --dist loadgroup")


def test_the_readme_is_short_and_has_a_quick_start_for_each_reader() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    for heading in ("## Two commands", "## Quick start: an engine", "## Quick start: a model", "## Quick start: a plugin"):
        assert heading in text, heading
    assert len(_python_blocks(README)) >= 4


def test_every_docs_link_of_the_readme_exists() -> None:
    links = re.findall(r"\]\((docs/[^)#]+)", README.read_text())
    assert links
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, missing


@pytest.mark.parametrize("index", range(len(_python_blocks(README))), ids=lambda i: f"block{i + 1}")
def test_every_readme_python_block_runs_on_its_own(index: int, tmp_path: Path) -> None:
    """Each block is a newcomer's copy and paste: its own imports, a fresh interpreter."""
    _run_python(_python_blocks(README)[index], f"README.md python block {index + 1}", tmp_path)


@pytest.mark.parametrize("page", _doc_pages(), ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_every_docs_page_runs_its_python_blocks_in_order(page: Path, tmp_path: Path) -> None:
    """A page's blocks build on each other, in one interpreter."""
    _run_python("\n\n".join(_python_blocks(page)), str(page.relative_to(ROOT)), tmp_path)


def test_pages_run_elsewhere_are_run_there() -> None:
    for page, test in DOCS_RUN_ELSEWHERE.items():
        assert page in (ROOT / test).read_text(), f"{test} does not run docs/{page}"


def _explain_examples() -> list[tuple[str, str, list[str]]]:
    """``(page, command, expected lines)`` for every ``$ quantcore explain`` line of the
    README and docs/, up to the next ``$`` line or the end of its block."""
    found = []
    for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in (text for language, text in _blocks(page) if language == ""):
            for chunk in re.split(r"^(?=\$ )", block, flags=re.M):
                if chunk.startswith("$ quantcore explain "):
                    command, *expected = chunk.rstrip("\n").splitlines()
                    found.append((str(page.relative_to(ROOT)), command, expected))
    return found


def test_the_explain_examples_are_found() -> None:
    pages = {page for page, _, _ in _explain_examples()}
    assert {"README.md", "docs/choosing.md"} <= pages


@pytest.mark.parametrize("page, command, expected", _explain_examples(), ids=lambda v: v if isinstance(v, str) else "")
def test_explain_examples_are_what_the_command_prints(page: str, command: str, expected: list[str]) -> None:
    """Each example, run after the README's install command (which installs the example
    plugin), prints exactly what the page shows (``| tail -1``: its last line)."""
    import importlib.metadata

    names = {ep.name for ep in importlib.metadata.entry_points(group="quantcore")}
    if "example_zero_folding" not in names:
        pytest.skip("the example plugin (installed by the README's commands) is not installed")
    args, _, pipe = command.removeprefix("$ quantcore ").partition("|")
    out = subprocess.run([sys.executable, "-m", "quantcore", *args.split()], capture_output=True, text=True,
                         timeout=BLOCK_TIMEOUT_S, env=_user_env())
    assert out.returncode == 0, out.stderr
    printed = [line.rstrip() for line in out.stdout.strip().splitlines()]
    if pipe.strip() == "tail -1":
        printed = printed[-1:]
    else:
        assert not pipe, f"{page}: {command}: only '| tail -1' is understood here"
    assert printed == [line.rstrip() for line in expected], f"{page}: {command}"
