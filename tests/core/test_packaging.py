"""Packaging: every package folder is installed without a hand-kept list, a built-in
backend is its folder plus one entry-point line, and the backends table (docs/backends.md)
says what the registry holds."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

from quantcore.registry import CASES_ENTRY_POINT_GROUP, ENTRY_POINT_GROUP, Registry

ROOT = Path(__file__).resolve().parents[2]
NOT_BACKENDS = {"formats", "conformance_cases"}  # built-in plugins that contribute no kernel


def _setup_module():  # setup.py, imported (its setup() call runs only as __main__)
    spec = importlib.util.spec_from_file_location("quantcore_setup", ROOT / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_package_folder_is_discovered_under_its_namespace() -> None:
    setup = _setup_module()
    packages = set(setup.discovered_packages())
    for package, folder in setup.package_dirs().items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            assert ".".join((package, *rel)) in packages, init
    assert "quantcore.backends.aten_cpu" in packages and "backends.aten_cpu" not in packages
    assert not [p for p in packages if p.split(".")[0] != "quantcore"]


def test_every_builtin_entry_point_names_a_discovered_package() -> None:
    packages = set(_setup_module().discovered_packages())
    ours = [ep for group in (ENTRY_POINT_GROUP, CASES_ENTRY_POINT_GROUP)
            for ep in importlib.metadata.entry_points(group=group)
            if ep.dist is not None and ep.dist.name == "quantcore"]
    assert len(ours) >= 14
    for ep in ours:
        assert ep.value in packages or ep.value.rsplit(".", 1)[0] in packages, ep


def test_every_backend_folder_that_registers_kernels_has_an_entry_point() -> None:
    """A backend folder whose hooks contribute kernels is a plugin only through its
    entry-point line; shared kernel code lives below the backends (quantcore/kernels)."""
    modules = {ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    for init in sorted((ROOT / "backends").glob("*/__init__.py")):
        registers = "quantcore_kernels" in init.read_text()
        name = f"quantcore.backends.{init.parent.name}"
        assert registers == (name in modules), f"{name}: registers kernels={registers}, entry point={name in modules}"
        assert registers, f"{name} registers no kernel: code backends share belongs in quantcore/kernels"


def _documented_backend_rows() -> dict[str, tuple[set[str], bool]]:
    """``{plugin: (kernels, from examples/)}`` from the backends table of docs/backends.md."""
    text = (ROOT / "docs" / "backends.md").read_text()
    table = text[text.index("| backend (entry point) | kernels |"):].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        backend, kernels = (cell.strip() for cell in line.strip("|").split("|")[:2])
        name = re.match(r"`([^`]+)`", backend)
        assert name, line
        rows[name.group(1)] = (set(re.findall(r"`([^`]+)`", kernels)), "examples/" in backend)
    return rows


def test_backends_table_matches_the_registry() -> None:
    rows = _documented_backend_rows()
    registry = Registry().load()
    plugins = {p.name: set(p.kernels) for p in registry.plugins() if p.name not in NOT_BACKENDS}
    for name, (kernels, example) in rows.items():
        if example and name not in plugins:
            continue  # the example plugin is not installed here
        assert name in plugins, f"docs/backends.md lists {name}, which no installed plugin is called"
        assert kernels == plugins[name], f"{name}: docs/backends.md says {sorted(kernels)}, the registry {sorted(plugins[name])}"
    missing = sorted(set(plugins) - set(rows))
    assert not missing, f"plugins without a row in the table of docs/backends.md: {missing}"
