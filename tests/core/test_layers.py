"""The layers contract (tests/layers.py): imports only point down, no backend imports
another, entry points name nothing above their loader, no import cycles, and the check
itself fails on a planted upward import. Also run by ``nox -s lint``."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..layers import (
    ROOT,
    cycles,
    entry_point_violations,
    layer_of,
    package_dirs,
    source_roots,
    violations,
)


def test_imports_only_point_down() -> None:
    assert violations(source_roots()) == []


def test_entry_points_name_nothing_above_their_loader() -> None:
    assert entry_point_violations() == []


def test_no_import_cycles() -> None:
    assert cycles(source_roots()) == []


def _copy_of_the_sources(tmp_path: Path) -> Path:
    for folder in package_dirs().values():
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "results", "*.md", "*.sh"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _plant(path: Path, code: str) -> None:
    path.write_text(path.read_text() + "\n\n" + code + "\n")


def test_a_planted_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    """The imports this contract was written against, each hidden in a function as they
    were: tuning -> the conformance harness, the registry -> benchmarks (by name), a
    format -> selection (under TYPE_CHECKING)."""
    root = _copy_of_the_sources(tmp_path)
    assert violations(source_roots(root)) == []
    _plant(root / "quantcore/tuning.py", "def _planted():\n    from .conformance.runner import run_cell\n")
    _plant(root / "quantcore/registry/manager.py",
           "def _planted():\n    import importlib\n    importlib.import_module('quantcore.benchmarks.timing')\n")
    _plant(root / "quantcore/formats/gptq/format.py",
           "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ...selection import get_kernel\n")
    found = violations(source_roots(root))
    assert any(v.startswith("quantcore.tuning:") and "quantcore.conformance.runner: points up" in v for v in found), found
    assert any(v.startswith("quantcore.registry.manager:") and "quantcore.benchmarks.timing: points up" in v
               for v in found), found
    assert any(v.startswith("quantcore.formats.gptq.format:") and "quantcore.selection: points up" in v
               for v in found), found
    assert len(found) == 3, found


def test_a_planted_sideways_import_or_cycle_breaks_it(tmp_path: Path) -> None:
    root = _copy_of_the_sources(tmp_path)
    _plant(root / "conformance/runner.py", "def _planted():\n    from quantcore.benchmarks import runner\n")
    _plant(root / "quantcore/formats/gptq/convert.py", "def _planted():\n    from .format import GPTQ\n")
    found = violations(source_roots(root))
    assert len(found) == 1 and "quantcore.conformance and quantcore.benchmarks are independent" in found[0], found
    (cycle,) = cycles(source_roots(root))  # format -> convert -> format (and quantize, via convert)
    assert {"quantcore.formats.gptq.convert", "quantcore.formats.gptq.format"} <= set(cycle)


def test_a_new_top_level_module_must_be_placed(tmp_path: Path) -> None:
    root = _copy_of_the_sources(tmp_path)
    (root / "quantcore/shiny.py").write_text('"""A module no layer claims."""\n')
    assert violations(source_roots(root)) == ["quantcore.shiny (" + str(root / "quantcore/shiny.py")
                                              + ") is in no layer: add it to tests/layers.py"]
    assert layer_of("quantcore.selection_state") == layer_of("quantcore.selection")


def test_a_backend_importing_another_backend_breaks_it(tmp_path: Path) -> None:
    """What awq_cpu did (aten_cpu's kernel and transform), absolutely and relatively; and
    the package reaching for a developer tool."""
    root = _copy_of_the_sources(tmp_path)
    _plant(root / "backends/awq_cpu/kernel.py", "def _planted():\n    from quantcore.backends.aten_cpu.kernel import AtenCpuGPTQ\n")
    _plant(root / "backends/triton_nvfp4/__init__.py", "def _planted():\n    from ..svdquant_torch import kernel\n")
    _plant(root / "quantcore/kernels/__init__.py", "def _planted():\n    import tools.compile_report\n")
    found = violations(source_roots(root))
    assert any(v.startswith("quantcore.backends.awq_cpu.kernel:") and "quantcore.backends.awq_cpu and "
               "quantcore.backends.aten_cpu are independent" in v for v in found), found
    assert any(v.startswith("quantcore.backends.triton_nvfp4:") and "quantcore.backends.triton_nvfp4 and "
               "quantcore.backends.svdquant_torch are independent" in v for v in found), found
    assert any(v.startswith("quantcore.kernels:") and "tools/ is not installed" in v for v in found), found
    assert len(found) == 3, found
    assert layer_of("quantcore.backends.aten_cpu.kernel") == layer_of("quantcore.backends")


def test_an_entry_point_above_its_loader_breaks_it(tmp_path: Path) -> None:
    """The core's own group once registered the conformance cases: get_kernel imported the
    matrix. A group no rule covers is refused too."""
    root = _copy_of_the_sources(tmp_path)
    assert entry_point_violations(root) == []
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text()
    group = '[project.entry-points.quantcore]\n'
    assert group in text
    pyproject.write_text(text.replace(group, group + 'cases = "quantcore.conformance.cases"\n')
                         + '\n[project.entry-points."quantcore.shiny"]\nshiny = "quantcore.kernels"\n')
    found = entry_point_violations(root)
    assert any(v.startswith("entry point quantcore:cases = quantcore.conformance.cases: points up") for v in found), found
    assert any("'quantcore.shiny' is in no rule" in v for v in found), found
    assert len(found) == 2, found
