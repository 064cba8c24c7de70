"""The quantcore command, run as a user runs it."""

from __future__ import annotations

import json
import os
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


def test_explain_shows_why_the_shape_moved_the_choice(tmp_path: Path) -> None:
    env = {**os.environ, "QUANTCORE_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "quantcore", "explain", "gptq", "cpu", "-M", "64", "-K", "4096",
                          "-N", "4096", "--allow-dense"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    for word in ("est. µs", "dense copy", "compressed", "ranked by declared costs", "chosen by M",
                 "M=1", "aten_cpu", "torch_fallback"):
        assert word in out.stdout, word


def test_tune_exports_a_table_and_explain_tune_shows_times(tmp_path: Path) -> None:
    env = {**os.environ, "QUANTCORE_CACHE": str(tmp_path / "cache")}
    table = tmp_path / "table.json"
    out = subprocess.run([sys.executable, "-m", "quantcore", "tune", "gptq", "-p", "group_size=32", "-K", "256",
                          "-N", "512", "-M", "1,64", "--export", str(table)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(table.read_text())
    assert data["schema"] == "quantcore.kernel-times/1"
    assert set(data["entries"]) == {"gptq4-g32-sym|linear|bf16|K256-M1-N512", "gptq4-g32-sym|linear|bf16|K256-M64-N512"}
    assert all({"aten_cpu", "torch_fallback"} <= set(e["seconds"]) for e in data["entries"].values())
    out = subprocess.run([sys.executable, "-m", "quantcore", "explain", "gptq", "cpu", "-p", "group_size=32",
                          "-M", "64", "-K", "256", "-N", "512", "--tune"], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    assert "measured µs" in out.stdout and "times measured on this device" in out.stdout
    assert out.stderr == ""  # answered from the cache `tune` filled; nothing printed beyond the table
