"""The quantcore command, run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


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
    out = quantcore("conformance", "--format", "gptq4-g128-asym-act", "--backend", "aten_cpu", "--group", "format",
                    "--json", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "gptq4-g128-asym-act" in out.stdout and "PASS" in out.stdout
    data = json.loads(path.read_text())
    assert data["counts"]["FAIL"] == 0 and data["counts"]["PASS"] == len(data["cells"]) > 10


# --- a CLI that scripts can trust --------------------------------------------------------------

NO_CUDA = not __import__("torch").cuda.is_available()


def test_help_describes_the_commands() -> None:
    out = quantcore("--help")
    assert out.returncode == 0
    assert "Entry point" not in out.stdout and "conformance matrix" in out.stdout
    for command in ("list", "doctor", "explain", "conformance", "bench"):
        assert command in out.stdout


@pytest.mark.skipif(not NO_CUDA, reason="a CUDA device is present")
@pytest.mark.parametrize("command", ["conformance", "bench gptq_linear"])
def test_an_absent_device_exits_2_naming_the_present_ones(command: str) -> None:
    out = quantcore(*command.split(), "--device", "cuda")
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip().endswith("available: cpu") and "--device cuda: not available here" in out.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["conformance", "--backend", "nosuch"], "--backend nosuch: no kernel or plugin is called that; known: aten_cpu"),
    (["conformance", "--format", "nosuch"], "--format nosuch: no format or case format is called that; formats: awq"),
    (["conformance", "--format", "svdquant", "--backend", "aten_cpu"],
     "no conformance cell matches --format svdquant --backend aten_cpu (the kernels run aten_cpu: compressed_tensors; aten_cpu: gptq)"),
    (["bench", "gptq_linear", "--shape", "M=1,K=4096"], "--shape M=1,K=4096: this suite takes M, K, N (missing N)"),
    (["bench", "gptq_linear", "--shapes", "huge"], "--shapes: expected one of"),
    (["bench", "nosuchsuite"], "bench suite: expected one of ['awq_linear'"),
    (["explain"], "the following arguments are required: format"),
    (["explain", "gptq", "-M", "x"], "argument -M: invalid int value: 'x'"),
    (["explain", "gptq", "-p", "bits"], "--param: expected key=value, got 'bits'"),
    (["conformance", "--profile", "huge"], "argument --profile: invalid choice: 'huge'"),
    (["nosuchcommand"], "invalid choice: 'nosuchcommand'"),
])
def test_every_argument_error_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    out = quantcore(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert says in out.stderr and out.stderr.strip().count("\n") == 0, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def _pytest_conformance(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "--pyargs", "quantcore.conformance", "-q",
                           "-p", "no:cacheprovider", *args], capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.mark.parametrize(("args", "says"), [
    (["--qc-backend", "nosuch"], "--qc-backend nosuch: no kernel or plugin is called that; known:"),
    (["--qc-format", "nosuch"], "--qc-format nosuch: no format or case format is called that"),
    (["--qc-format", "svdquant", "--qc-backend", "aten_cpu"], "no conformance cell matches"),
    *([(["--qc-device", "cuda"], "--qc-device cuda: not available here")] if NO_CUDA else []),
])
def test_the_pytest_plugin_refuses_what_would_run_nothing(tmp_path: Path, args: list[str], says: str) -> None:
    """Before: ``--qc-backend nosuch`` exited 0 with "1 skipped"."""
    out = _pytest_conformance(tmp_path, *args)
    assert out.returncode == 4, out.stdout + out.stderr  # pytest's usage error
    assert says in out.stderr, out.stderr


def test_progress_has_an_eta_and_the_summary_fits_a_terminal() -> None:
    out = quantcore("conformance", "--format", "gptq4-g128-asym", "--format", "awq4-g128")
    assert out.returncode == 0, out.stderr
    assert "ETA" in out.stderr and "/" in out.stderr
    table = out.stdout.split("\n\n")[1]
    assert max(len(line) for line in table.splitlines()) <= 100, table
    assert "family" in table and "worst err" in table and "aten_cpu" in table


def test_doctor_says_what_is_true_of_triton_on_a_cpu() -> None:
    import importlib.metadata

    try:
        version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("triton is not installed")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "quantcore", "doctor", "--device", "cpu"],
                         capture_output=True, text=True, timeout=300, env=env)
    line = next(line for line in out.stdout.splitlines() if line.startswith("package triton"))
    assert f"{version} installed, usable through the interpreter only (no GPU here)" in line, line
    assert "no (" not in line
    env["TRITON_INTERPRET"] = "1"
    out = subprocess.run([sys.executable, "-m", "quantcore", "doctor", "--device", "cpu"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert f"package triton      {version} (through the interpreter, TRITON_INTERPRET=1)" in out.stdout
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
