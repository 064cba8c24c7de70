"""The developer tools (``tools/``) and the benchmark suites import only what exists.

They run on a GPU, between sessions, and import much of what they use inside functions,
so a rename in the package breaks them silently until a device call fails. Every
``from quantcore… import name`` and ``from tools… import name`` in them — at module level
or inside a function — must name a module that imports here and a name it has, and every
``python -m module`` in the probe scripts must name a module that exists.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("tools", "benchmarks")


def _imports() -> list[tuple[str, str, str]]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                        node.module.split(".")[0] in ("quantcore", "tools"):
                    found += [(str(path.relative_to(ROOT)), node.module, a.name) for a in node.names]
    return found


def test_every_import_in_the_tools_and_suites_resolves() -> None:
    missing = []
    for where, module, name in _imports():
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{where}: {module} ({exc})")
            continue
        submodule = hasattr(mod, "__path__") and importlib.util.find_spec(f"{module}.{name}") is not None
        if name != "*" and not hasattr(mod, name) and not submodule:
            missing.append(f"{where}: {module} has no {name}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "tools" / "probes").glob("*.sh")))
def test_every_module_a_probe_script_runs_exists(script: str) -> None:
    text = (ROOT / "tools" / "probes" / script).read_text()
    modules = set(re.findall(r"python3? -m ([A-Za-z_][\w.]*)", text)) - {"pip", "pytest"}
    assert [m for m in sorted(modules) if importlib.util.find_spec(m) is None] == []
