"""quantcore bench on CPU: a small smoke run (no timing assertions) writes what it says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quantcore.benchmarks.memory import rotation_sets
from quantcore.benchmarks.report import device_slug

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_run_writes_json_page_and_plot(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "quantcore", "bench", "gptq_linear", "--shape", "M=1,K=256,N=512",
         "--shape", "M=4,K=256,N=512", "--rounds", "2", "--out", str(tmp_path / "results"),
         "--plot", str(tmp_path / "plot.png")],
        capture_output=True, text=True, timeout=600, env={**__import__("os").environ, "QUANTCORE_CACHE": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    for word in ("aten_cpu", "aten_op_raw", "dense_bf16", "dense_fp32", "vs dense_bf16", "of copy BW"):
        assert word in out.stdout
    (page,) = (tmp_path / "results").glob("*.md")
    data = json.loads((tmp_path / "results" / page.stem / "gptq_linear.json").read_text())
    assert data["ceilings"]["copy_bytes_per_s"] > 0 and data["device_name"]
    kernels = {r["variant"] for r in data["rows"]}
    assert {"aten_cpu", "torch_fallback", "aten_op_raw", "dense_bf16"} <= kernels
    row = next(r for r in data["rows"] if r["variant"] == "aten_cpu")
    assert row["time_s"] > 0 and set(row["speedup_vs"]) >= {"aten_op_raw", "dense_bf16", "dense_fp32"}
    assert "| M1-K256-N512" in page.read_text()
    # The default choice is marked, in the JSON and on the page, and checked against the goal.
    chosen = [r for r in data["rows"] if r.get("chosen")]
    assert [(r["case"], r["variant"]) for r in chosen] == [("M1-K256-N512", "aten_cpu"), ("M4-K256-N512", "aten_cpu")]
    assert all(r["candidate"] == "gptq4-g128-sym" for r in chosen)
    assert next(r for r in data["rows"] if r["variant"] == "torch_fallback")["keeps_dense"] is True
    assert "aten_cpu ★" in page.read_text() and "★ marks the kernel `get_kernel` chooses" in page.read_text()
    assert [c["met"] for c in data["default_check"]] == [True, True]
    assert any("default aten_cpu 1.00× the fastest compressed kernel (aten_cpu)" in n for n in data["notes"])
    assert (tmp_path / "plot.png").stat().st_size > 1000


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_a_plain_run_leaves_the_checkout_as_it_was(tmp_path: Path) -> None:
    """A newcomer's first ``quantcore bench gptq_linear --shape ...`` from the repository root
    once replaced the committed results; by default they go to the user's cache."""
    before = _git_status()
    out = subprocess.run(
        [sys.executable, "-m", "quantcore", "bench", "gptq_linear", "--shape", "M=1,K=256,N=512", "--rounds", "2"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "QUANTCORE_CACHE": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    assert _git_status() == before
    (written,) = (tmp_path / "bench").glob("*/gptq_linear.json")
    assert json.loads(written.read_text())["rows"] and written.parent.with_suffix(".md").exists()
    assert str(written) in out.stderr


def test_save_writes_the_committed_results_only_from_the_repository_root(tmp_path: Path) -> None:
    env = {**os.environ, "QUANTCORE_CACHE": str(tmp_path)}
    args = [sys.executable, "-m", "quantcore", "bench", "gptq_linear", "--shape", "M=1,K=256,N=512"]
    out = subprocess.run([*args, "--save"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert out.returncode != 0
    assert "--save: expected the repository root as the current folder (with benchmarks/results/)" in out.stderr
    out = subprocess.run([*args, "--save", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env=env)
    assert out.returncode == 2 and "not allowed with argument" in out.stderr
    assert not list(tmp_path.rglob("*.json"))


def test_list_suites() -> None:
    out = subprocess.run([sys.executable, "-m", "quantcore", "bench"], capture_output=True, text=True, check=True)
    assert "gptq_linear" in out.stdout and "overhead" in out.stdout


@pytest.mark.parametrize(("per_set", "expected"), [(1 << 30, 1), (1, 8)])
def test_rotation_covers_twice_the_cache(per_set: int, expected: int) -> None:
    assert rotation_sets(per_set, "cpu") == expected


def test_device_slug() -> None:
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
