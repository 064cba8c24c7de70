"""Broken plugins, fault by fault. For each: the other plugins keep working (selection,
prepare and a correct call), ``quantcore list`` shows the broken one with its error, and
where the fault is a kernel's, ``get_kernel`` falls to the next candidate and ``explain``
says why.

Faults in runtime-registered plugins run in-process (``quantcore list`` through
``main(["list"])`` on the test's registry); faults of installed distributions run the
real command in a subprocess over fake dist-infos on ``PYTHONPATH``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from quantcore import registry as registry_module
from quantcore.binding import bind
from quantcore.cli.main import main
from quantcore.errors import PluginError
from quantcore.formats.gptq import GPTQ
from quantcore.problem import Problem
from quantcore.registry import Registry, hookimpl
from quantcore.selection import explain, get_kernel

from ..core.fakes import Plugin, dense_kernel

FMT = GPTQ(group_size=32, sym=False)
P = Problem.linear(FMT, M=2, K=128, N=64, dtype=torch.float32)
REPO = Path(__file__).resolve().parents[2]


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return FMT.quantize(torch.randn(64, 128, generator=gen), generator=gen)


def others_keep_working(reg: Registry, *, expect: str = "aten_cpu") -> None:
    """Selection still answers, and the chosen kernel prepares and computes correctly."""
    assert get_kernel(FMT, "cpu", problem=P, registry=reg).name == expect
    t = weights(7)
    bound = bind(FMT, "cpu", t, problem=P, registry=reg)
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(1))
    ref = x.double() @ FMT.dequantize(t).T
    assert (bound(x).double() - ref).norm() / ref.norm() < 1e-5
    assert reg.format_class("gptq") is GPTQ
    assert {"aten_cpu", "torch_fallback"} <= {e.cls.name for e in reg.kernels("gptq")}


def listed(reg: Registry, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, Any]]:
    """``quantcore list`` (table and JSON) run in this process on ``reg``."""
    monkeypatch.setattr(registry_module, "_default", reg)
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["list"]) == 0
    text = out.getvalue()
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["list", "--json", "-"]) == 0
    return text, json.loads(out.getvalue())


# --- faults in a plugin's hooks and kernels --------------------------------------------------


class RaisingFormats:
    @hookimpl
    def quantcore_formats(self) -> list[Any]:
        raise RuntimeError("formats hook exploded")


class RaisingKernels:
    @hookimpl
    def quantcore_kernels(self) -> list[Any]:
        raise RuntimeError("kernels hook exploded")


class RaisingCases:
    @hookimpl
    def quantcore_conformance_cases(self) -> list[Any]:
        raise RuntimeError("cases hook exploded")


class Returns:
    """A plugin whose hook returns ``value`` (not what the hook promises)."""

    def __init__(self, hook: str, value: Any) -> None:
        self.value = value
        setattr(self, hook, hookimpl(specname=hook)(lambda: self.value))


def _kernel(name: str, **methods: Callable[..., Any]) -> type:
    k = dense_kernel(name, priority=500)
    for attr, fn in methods.items():
        setattr(k, attr, classmethod(fn) if attr in ("supports", "check_device", "priority_on") else fn)
    return k


def _raise(msg: str) -> Callable[..., Any]:
    def fn(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(msg)
    return fn


class WrongFormat(GPTQ):
    """A different format class claiming the name "gptq"."""


@dataclass(frozen=True)
class Fault:
    id: str
    install: Callable[[Registry], None]
    #: what ``quantcore list`` must print for it
    listed: str
    #: the faulty kernel's row in explain: (kernel, reason fragment); None for load faults
    explained: tuple[str, str] | None = None
    #: the fault fires only when the kernel meets a weight (bind), not at selection
    at_run_time: bool = False


FAULTS = [
    Fault("formats hook raises", lambda r: r.register(RaisingFormats(), name="bad_formats"),
          "bad_formats [quantcore_formats] RuntimeError: formats hook exploded"),
    Fault("kernels hook raises", lambda r: r.register(RaisingKernels(), name="bad_kernels"),
          "bad_kernels [quantcore_kernels] RuntimeError: kernels hook exploded"),
    Fault("cases hook raises", lambda r: (r.register(RaisingCases(), name="bad_cases"), r.conformance_cases()),
          "bad_cases [quantcore_conformance_cases] RuntimeError: cases hook exploded"),
    Fault("formats hook returns garbage", lambda r: r.register(Returns("quantcore_formats", [42]), name="junk_formats"),
          "junk_formats [validate] quantcore_formats returned 42, not a Format subclass"),
    Fault("formats hook returns a non-iterable", lambda r: r.register(Returns("quantcore_formats", 42), name="int_formats"),
          "int_formats [quantcore_formats] TypeError"),
    Fault("kernels hook returns garbage", lambda r: r.register(Returns("quantcore_kernels", ["aten_cpu"]), name="junk_kernels"),
          "junk_kernels [validate] quantcore_kernels returned 'aten_cpu': not a Kernel subclass"),
    Fault("cases hook returns garbage",
          lambda r: (r.register(Returns("quantcore_conformance_cases", [42]), name="junk_cases"), r.conformance_cases()),
          "junk_cases [validate] quantcore_conformance_cases returned 42, not a conformance Case"),
    Fault("two plugins, one kernel name", lambda r: r.register(Plugin(dense_kernel("aten_cpu", priority=900)), name="impostor"),
          "impostor [validate] kernel 'aten_cpu' for gptq/linear is already registered by plugin 'aten_cpu'"),
    Fault("two plugins, one format name", lambda r: r.register(Returns("quantcore_formats", [WrongFormat]), name="format_thief"),
          "format_thief [validate] format 'gptq' is already registered by plugin 'formats'"),
    Fault("supports raises", lambda r: r.register(Plugin(_kernel("sup_boom", supports=_raise("supports broke"))), name="p_sup"),
          "sup_boom (gptq/linear) on cpu: supports raised RuntimeError: supports broke",
          ("sup_boom", "failed at run time: supports raised RuntimeError: supports broke")),
    Fault("check_device raises", lambda r: r.register(Plugin(_kernel("dev_boom", check_device=_raise("probe broke"))), name="p_dev"),
          "dev_boom (gptq/linear) on cpu: check_device raised RuntimeError: probe broke",
          ("dev_boom", "failed at run time: check_device raised RuntimeError: probe broke")),
    Fault("priority_on raises", lambda r: r.register(Plugin(_kernel("rank_boom", priority_on=_raise("rank broke"))), name="p_rank"),
          "rank_boom (gptq/linear) on cpu: priority_on raised RuntimeError: rank broke",
          ("rank_boom", "failed at run time: priority_on raised RuntimeError: rank broke")),
    Fault("prepare raises at run time", lambda r: r.register(Plugin(_kernel("prep_boom", prepare=_raise("prepare broke"))), name="p_prep"),
          "prep_boom (gptq/linear) on cpu: prepare raised RuntimeError: prepare broke",
          ("prep_boom", "failed at run time: prepare raised RuntimeError: prepare broke"), at_run_time=True),
    Fault("call raises at run time", lambda r: r.register(Plugin(_kernel("call_boom", __call__=_raise("call broke"))), name="p_call"),
          "call_boom (gptq/linear) on cpu: call raised RuntimeError: call broke",
          ("call_boom", "failed at run time: call raised RuntimeError: call broke"), at_run_time=True),
]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.id)
def test_broken_plugin(fault: Fault, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    fault.install(registry)
    if fault.at_run_time:
        # The faulty kernel ranks first and is chosen until it meets a weight.
        t = weights(3)
        bound = bind(FMT, "cpu", t, problem=P, registry=registry)
        x = torch.randn(2, 128, generator=torch.Generator().manual_seed(2))
        y = bound(x)  # a failing call is retried on the next kernel
        ref = x.double() @ FMT.dequantize(t).T
        assert (y.double() - ref).norm() / ref.norm() < 1e-5
        assert bound.kernel.name == "aten_cpu"
    if fault.explained:
        kernel, reason = fault.explained
        rows = {c.kernel: c for c in explain(FMT, "cpu", problem=P, registry=registry).candidates}
        assert rows[kernel].status == "refused" and rows[kernel].reason == reason, rows[kernel]
        assert rows["aten_cpu"].status == "selected"
    else:
        expl = explain(FMT, "cpu", problem=P, registry=registry)
        assert any(c.status == "broken" for c in expl.candidates), expl.table()
    others_keep_working(registry)
    text, data = listed(registry, monkeypatch)
    assert fault.listed in text, text
    if not fault.explained:
        assert any(p["status"] == "broken" and p["broken"] for p in data["plugins"])
    else:
        assert any(f["kernel"] == fault.explained[0] for f in data["failures"])


def test_duplicate_plugin_name_at_run_time(registry: Registry) -> None:
    registry.register(Plugin(dense_kernel("first_one")), name="dup")
    with pytest.raises(PluginError, match="plugin name 'dup' is already registered"):
        registry.register(Plugin(dense_kernel("second_one")), name="dup")
    assert "second_one" not in {e.cls.name for e in registry.kernels("gptq")}
    others_keep_working(registry)


# --- faults of installed distributions: the real command, in a subprocess --------------------


def _dist(root: Path, dist: str, ep: str, module: str, body: str) -> None:
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"  # the stem's first "-" ends the name
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[quantcore]\n{ep} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(body))


GOOD = """
from quantcore.registry import hookimpl
from tests.core.fakes import dense_kernel

@hookimpl
def quantcore_kernels():
    return [dense_kernel("{name}", priority=5)]
"""


@pytest.fixture(scope="module")
def broken_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("site")
    _dist(root, "vendor-missing-sdk", "vendor_missing_sdk", "vendor_missing_sdk_mod", "import vendor_sdk_that_is_not_here\n")
    _dist(root, "vendor-raises", "vendor_raises", "vendor_raises_mod", "raise RuntimeError('driver not initialised')\n")
    _dist(root, "vendor-exits", "vendor_exits", "vendor_exits_mod", "import sys\nsys.exit('vendor gave up')\n")
    _dist(root, "vendor-hook", "vendor_hook", "vendor_hook_mod", """
        from quantcore.registry import hookimpl

        @hookimpl
        def quantcore_kernels():
            raise OSError('libvendor.so: cannot open shared object file')
        """)
    _dist(root, "vendor-one", "vendor_twin", "vendor_one_mod", GOOD.format(name="twin_one"))
    _dist(root, "vendor-two", "vendor_twin", "vendor_two_mod", GOOD.format(name="twin_two"))
    _dist(root, "vendor-ok", "vendor_ok", "vendor_ok_mod", GOOD.format(name="vendor_ok_kernel"))
    return root


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "quantcore", *args], capture_output=True, text=True, env=env, timeout=300)


def test_broken_distributions_are_listed_and_isolated(broken_site: Path) -> None:
    out = _run(broken_site, "list")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for line in (
        "vendor_missing_sdk [import] ModuleNotFoundError: No module named 'vendor_sdk_that_is_not_here'",
        "vendor_raises [import] RuntimeError: driver not initialised",
        "vendor_exits [import] SystemExit: vendor gave up",
        "vendor_hook [quantcore_kernels] OSError: libvendor.so: cannot open shared object file",
        "plugin name 'vendor_twin' is already registered by entry point vendor-",
    ):
        assert line in text, f"{line!r} not in:\n{text}"
    data = json.loads(_run(broken_site, "list", "--json", "-").stdout)
    status = {p["name"]: p["status"] for p in data["plugins"]}
    assert status["vendor_ok"] == status["aten_cpu"] == status["vendor_twin"] == "ok"
    kernels = {k["name"] for k in data["kernels"]}
    assert {"vendor_ok_kernel", "aten_cpu", "torch_fallback"} <= kernels
    assert len({"twin_one", "twin_two"} & kernels) == 1  # the first distribution keeps the name
    explained = _run(broken_site, "explain", "gptq", "cpu", "-M", "1", "-K", "128", "-N", "64")
    assert explained.returncode == 0 and "selected" in explained.stdout
    for name in ("vendor_missing_sdk", "vendor_raises", "vendor_exits", "vendor_hook"):
        assert name in explained.stdout and "broken" in explained.stdout
