"""The fuzz cases of the kernels that call aten ops directly (torch's int4pack ops),
run again in a child process — their inputs, their weights and their prepared state
handed back: a bad input that reached such an op could abort or crash the process
rather than raise, which only the exit status of a process shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_aten_backed_kernels_fuzzed_in_a_child_process(tmp_path: Path) -> None:
    report = tmp_path / "fuzz.json"
    # One thread: this child runs beside the xdist workers, and oversubscribed OpenMP
    # threads spin each other to a crawl.
    env = {**os.environ, "QUANTCORE_FUZZ_REPORT": str(report), "PYTHONFAULTHANDLER": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "tests/hardening/test_fuzz_kernels.py", "tests/hardening/test_fuzz_transforms.py",
           "tests/hardening/test_fuzz_state.py",
           "-k", "aten_cpu or awq_cpu or int4pack"]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"exit status {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    assert "Fatal Python error" not in out.stderr
    data = json.loads(report.read_text())
    assert data["cases"] > 100 and data["crashes"] == 0
