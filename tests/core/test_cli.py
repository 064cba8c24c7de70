"""The quantcore command, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def quantcore(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "quantcore", *args], capture_output=True, text=True, timeout=300)


def test_list_shows_plugins_and_kernels() -> None:
    out = quantcore("list")
    assert out.returncode == 0, out.stderr
    for word in ("aten_cpu", "torch_fallback", "formats", "gptq", "priority"):
        assert word in out.stdout


def test_list_json() -> None:
    data = json.loads(quantcore("list", "--json", "-").stdout)
    names = {k["name"] for k in data["kernels"]}
    assert {"aten_cpu", "torch_fallback"} <= names


def test_doctor_reports_every_device_type() -> None:
    out = quantcore("doctor")
    assert out.returncode == 0
    for device in ("cpu", "cuda", "xpu", "npu"):
        assert f"\n{device}\n" in out.stdout


def test_explain_selected_and_refused() -> None:
    out = quantcore("explain", "gptq", "cpu", "-M", "1", "-K", "4096", "-N", "40", "-p", "group_size=32")
    assert out.returncode == 0
    assert "refused" in out.stdout and "N=40" in out.stdout and "selected" in out.stdout


def test_explain_nothing_usable_exits_1_with_reasons() -> None:
    out = quantcore("explain", "gptq", "xpu", "--json", "-")
    assert out.returncode == 1
    data = json.loads(out.stdout)
    assert data["selected"] is None
    assert {c["status"] for c in data["candidates"] if c["kernel"] != "-"} == {"refused"}


def test_explain_unknown_format_is_a_clean_error() -> None:
    out = quantcore("explain", "gtpq")
    assert out.returncode == 2 and "expected one of" in out.stderr and "Traceback" not in out.stderr


def test_conformance_prints_matrix_and_json(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    out = quantcore("conformance", "--format", "gptq4-g128-asym-act", "--backend", "aten_cpu", "--json", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "gptq4-g128-asym-act" in out.stdout and "PASS" in out.stdout
    data = json.loads(path.read_text())
    assert data["counts"]["FAIL"] == 0 and data["counts"]["PASS"] == len(data["cells"]) > 10
