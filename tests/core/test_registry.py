"""The registry: entry points, runtime registration, and isolation of broken plugins."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from quantcore.errors import PluginError, UnknownFormatError
from quantcore.formats.gptq import GPTQ
from quantcore.registry import Registry

from .fakes import Plugin, RaisingHook, dense_kernel


def test_builtins_load_through_entry_points(registry: Registry) -> None:
    assert registry.conformance_cases()  # the case plugins load when cases are asked for
    names = {p.name: p for p in registry.plugins()}
    for plugin in ("formats", "aten_cpu", "torch_fallback", "conformance_cases"):
        assert names[plugin].status == "ok", names[plugin].broken
        assert names[plugin].source.startswith("entry point quantcore")
    assert registry.format_class("gptq") is GPTQ
    assert {e.cls.name for e in registry.kernels("gptq", "linear")} >= {"aten_cpu", "torch_fallback"}


def test_runtime_registration_and_unregister(registry: Registry) -> None:
    before = registry.generation
    name = registry.register(Plugin(dense_kernel("runtime_dense")), name="rt")
    assert name == "rt" and registry.generation > before
    assert "runtime_dense" in {e.cls.name for e in registry.kernels("gptq")}
    registry.unregister("rt")
    assert "runtime_dense" not in {e.cls.name for e in registry.kernels("gptq")}
    with pytest.raises(PluginError, match="no plugin named 'rt'"):
        registry.unregister("rt")


def test_duplicate_plugin_name_is_refused(registry: Registry) -> None:
    registry.register(Plugin(), name="dup")
    with pytest.raises(PluginError, match="already registered"):
        registry.register(Plugin(), name="dup")


def test_hook_that_raises_is_isolated(registry: Registry) -> None:
    registry.register(RaisingHook(), name="raiser")
    registry.register(Plugin(dense_kernel("survivor")), name="good")
    broken = {b.plugin: b for b in registry.broken()}
    assert broken["raiser"].stage == "quantcore_kernels"
    assert "vendor library not initialised" in broken["raiser"].error
    assert "survivor" in {e.cls.name for e in registry.kernels("gptq")}


@pytest.mark.parametrize(
    ("garbage", "expected"),
    [
        (42, "not a Kernel subclass"),
        ("aten_cpu", "not a Kernel subclass"),
        (GPTQ, "not a Kernel subclass"),
    ],
)
def test_hook_returning_garbage_is_recorded(registry: Registry, garbage: object, expected: str) -> None:
    registry.register(Plugin(garbage, dense_kernel("fine")), name="mixed")
    errors = [b.error for b in registry.broken() if b.plugin == "mixed"]
    assert errors and expected in errors[0]
    assert "fine" in {e.cls.name for e in registry.kernels("gptq")}


def test_abstract_and_nameless_kernels_are_refused(registry: Registry) -> None:
    from quantcore.kernel import LinearKernel

    nameless = dense_kernel("x")
    del nameless.name
    registry.register(Plugin(LinearKernel, nameless), name="bad_classes")
    errors = " | ".join(b.error for b in registry.broken() if b.plugin == "bad_classes")
    assert "abstract" in errors and "'name' must be a str" in errors


def test_two_plugins_same_kernel_name(registry: Registry) -> None:
    registry.register(Plugin(dense_kernel("clash")), name="first")
    registry.register(Plugin(dense_kernel("clash")), name="second")
    (err,) = [b.error for b in registry.broken() if b.plugin == "second"]
    assert "already registered by plugin 'first'" in err
    (entry,) = [e for e in registry.kernels("gptq") if e.cls.name == "clash"]
    assert entry.plugin == "first"


def test_wrong_hook_name_is_a_register_error(registry: Registry) -> None:
    from quantcore.registry import hookimpl

    class Typo:
        @hookimpl
        def quantcore_kernel(self) -> list[object]:  # missing "s"
            return []

    registry.register(Typo(), name="typo")
    (b,) = [b for b in registry.broken() if b.plugin == "typo"]
    assert b.stage == "register" and "quantcore_kernel" in b.error


def test_unknown_format_names_the_known_ones(registry: Registry) -> None:
    with pytest.raises(UnknownFormatError, match=r"expected one of \[.*'gptq'.*\], got 'gtpq'"):
        registry.format_class("gtpq")


def _fake_distribution(root: Path, name: str, module: str, body: str) -> None:
    """An installed distribution on sys.path: a dist-info with one quantcore entry point."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[quantcore]\n{name} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(body))


def test_entry_point_that_fails_to_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_distribution(tmp_path, "vendor_broken", "vendor_broken_mod", "import vendor_sdk_that_is_not_here\n")
    _fake_distribution(
        tmp_path, "vendor_ok", "vendor_ok_mod",
        """
        from quantcore.registry import hookimpl
        from tests.core.fakes import dense_kernel

        @hookimpl
        def quantcore_kernels():
            return [dense_kernel("vendor_ok_kernel")]
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry().load()
    status = {p.name: p for p in reg.plugins()}
    assert status["vendor_broken"].status == "broken"
    (b,) = status["vendor_broken"].broken
    assert b.stage == "import" and "vendor_sdk_that_is_not_here" in b.error
    assert status["vendor_ok"].status == "ok"
    assert "vendor_ok_kernel" in {e.cls.name for e in reg.kernels("gptq")}
    assert status["aten_cpu"].status == "ok"


def test_blocked_plugins_are_listed_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTCORE_BLOCK_PLUGINS", "aten_cpu, torch_fallback")
    reg = Registry().load()
    status = {p.name: p.status for p in reg.plugins()}
    assert status["aten_cpu"] == status["torch_fallback"] == "blocked"
    assert not {"aten_cpu", "torch_fallback"} & {e.cls.name for e in reg.kernels("gptq")}
    assert status["formats"] == "ok"
