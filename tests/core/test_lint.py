"""Lint in CI: ruff over the sources, as ``nox -s lint`` runs it (mypy stays in the nox
session: it takes a minute)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' brings it)")
    out = subprocess.run([ruff, "check", "--no-cache", "quantcore", "backends", "conformance", "benchmarks", "tools", "tests"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
