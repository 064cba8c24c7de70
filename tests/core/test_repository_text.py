"""Text that explains itself: no tracked file names an issue number, a path of one
developer's machine, or the tools of one workplace; a reader has the repository only."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FORBIDDEN = {
    "an issue number": re.compile(r"[Ii]ssue[ _-]?[0-9]+"),
    "a machine path": re.compile(r"(?<![\w.~])/(work|tmp|home|root|opt|scratch|mnt)/"),
    "a workplace's tool": re.compile(r"\b(devsync|coordinator)\b|\.dev/"),
}


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def test_no_tracked_text_names_an_issue_a_machine_path_or_a_workplace_tool() -> None:
    found = []
    for path in _tracked():
        if path == "tests/core/test_repository_text.py":
            continue  # names what it forbids
        for what, pattern in FORBIDDEN.items():
            if pattern.search(path):
                found.append(f"{path}: its name holds {what}")
        try:
            text = (ROOT / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # a binary (plots), or deleted in the working tree
        for number, line in enumerate(text.splitlines(), 1):
            for what, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    found.append(f"{path}:{number}: {what}: {line.strip()[:120]}")
    assert not found, "\n".join(found)
