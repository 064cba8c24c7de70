"""quantcore's layers contract: every import points down.

The layers, top to bottom (modules of one layer may import each other, and any layer
below; a group marked independent may not import its own siblings either)::

    conformance | benchmarks       above the core: the matrix, the bench framework (independent)
    backends.*                     the built-in plugins, each its own (independent: a backend
                                   never imports another; what two share lives in kernels)
    cli                            the quantcore command (and the package's lazy facade)
    checkpoint, nn, hf             torch modules, checkpoint loading, the transformers integration
    selection, binding, tuning, measured, api, custom_ops
    registry
    kernels                        kernel bases, costs and kernels more than one backend uses
    transforms, ops                shared transforms; ops with their golden references and judge
    formats, problem, kernel, transform, cost
    probe, tensors, dtypes, errors, timing, triton, schema, files

An entry in a layer ending in ``.*`` makes each package under that prefix a sibling of
its own (``quantcore.backends.aten_cpu``, ``quantcore.backends.awq_cpu``, ...).

Entry points count as imports too: the module that loads a group imports what the group
names, at run time. :data:`ENTRY_POINT_GROUPS` says, for each group pyproject.toml
declares, the highest layer its targets may sit in — the ``quantcore`` group is loaded by
``get_kernel``'s registry, so it may name backends and the core, never the conformance
matrix or the bench.

Every import counts: at module level, inside functions, under ``TYPE_CHECKING``, and
``importlib.import_module("literal")``. import-linter was the first choice, but its graph
(grimp) walks the ``quantcore/`` folder only: the folders the package-dir mapping
installs inside the namespace (``backends/`` as ``quantcore.backends``, ...) are invisible
to it, so an upward import into them would pass. This checker reads the mapping instead.

Run it as ``python tests/layers.py`` (``nox -s lint``) or through ``tests/core/test_layers.py``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The developer tools' top-level package (tools/): not installed, so never imported by the package.
TOOLS = "tools"

#: Top to bottom. Each entry: (module prefixes, independent siblings).
LAYERS: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("quantcore.conformance", "quantcore.benchmarks"), True),
    (("quantcore.backends.*", "quantcore.backends"), True),
    (("quantcore.cli", "quantcore.__main__", "quantcore"), False),
    (("quantcore.checkpoint", "quantcore.nn", "quantcore.hf"), False),
    (("quantcore.selection", "quantcore.selection_state", "quantcore.binding", "quantcore.tuning", "quantcore.measured",
      "quantcore.api", "quantcore.custom_ops"),
     False),
    (("quantcore.registry",), False),
    (("quantcore.kernels",), False),
    (("quantcore.transforms", "quantcore.ops"), False),
    (("quantcore.formats", "quantcore.problem", "quantcore.kernel", "quantcore.transform", "quantcore.cost"), False),
    (("quantcore.probe", "quantcore.tensors", "quantcore.triton", "quantcore.dtypes", "quantcore.errors",
      "quantcore.timing", "quantcore.schema", "quantcore.files"), False),
)

#: Entry-point group -> the highest layer (a prefix of :data:`LAYERS`) its targets may sit in,
#: given who loads the group.
ENTRY_POINT_GROUPS: dict[str, str] = {
    "quantcore": "quantcore.backends.*",  # the registry, on get_kernel's first call
    "quantcore.conformance": "quantcore.conformance",  # the registry, when the matrix asks for cases
    "quantcore.commands": "quantcore.conformance",  # the quantcore command, for its sub-commands
    "pytest11": "quantcore.conformance",  # pytest, in a test run
}



def _pyproject(root: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib.loads((root / "pyproject.toml").read_text())
    from setuptools.config.pyprojecttoml import load_file  # pragma: no cover

    return dict(load_file(str(root / "pyproject.toml")))  # pragma: no cover


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """pyproject's package-dir mapping: installed package -> the repository folder."""
    return dict(_pyproject(root)["tool"]["setuptools"]["package-dir"])


def entry_points(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """pyproject's entry points: group -> {name: target module}."""
    groups = _pyproject(root)["project"].get("entry-points", {})
    return {group: {name: value.split(":")[0].strip() for name, value in eps.items()}
            for group, eps in groups.items()}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    #: Under ``if TYPE_CHECKING:``: a dependency for the layers, never executed.
    typing_only: bool = False

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}"


def modules(roots: Mapping[str, Path]) -> dict[str, Path]:
    """Every module under the package-dir mapping: dotted name -> file."""
    found: dict[str, Path] = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if not all(_is_package(folder, rel.parts[:i]) for i in range(1, len(rel.parts))):
                continue  # a loose script folder without __init__.py is not installed
            found[".".join([package, *parts])] = path
    return found


def _is_package(folder: Path, parts: tuple[str, ...]) -> bool:
    return (folder.joinpath(*parts) / "__init__.py").exists()


def imports(name: str, path: Path, known: Mapping[str, Path]) -> Iterator[Import]:
    """The quantcore modules ``name`` imports, wherever in the file the import stands."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {id(n) for block in ast.walk(tree) if _is_type_checking_block(block)
                   for stmt in block.body for n in ast.walk(stmt)}  # type: ignore[attr-defined]
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(name, is_package, node.module, node.level)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif (isinstance(node, ast.Call) and _is_import_module(node.func) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]
        for target in targets:
            if target.split(".")[0] in ("quantcore", TOOLS):
                yield Import(name, target, node.lineno, id(node) in typing_only)


def _is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _is_import_module(func: ast.expr) -> bool:
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module")


def _absolute(name: str, is_package: bool, module: str | None, level: int) -> str:
    if not level:
        return module or ""
    parts = name.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


def _matches(module: str, prefix: str) -> bool:
    if prefix.endswith(".*"):
        return module.startswith(prefix[:-1])
    if prefix == "quantcore":
        return module == prefix  # the root entry is the facade module itself, not everything
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int | None:
    """Index into LAYERS (0 = top) of the longest matching prefix."""
    best: tuple[int, int] | None = None
    for index, (prefixes, _) in enumerate(LAYERS):
        for prefix in prefixes:
            if _matches(module, prefix) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def sibling_of(module: str) -> str:
    """The sibling ``module`` belongs to: its layer entry (prefix), or for an entry ending
    in ``.*`` the package under it (``quantcore.backends.aten_cpu``)."""
    for prefixes, _ in LAYERS:
        for prefix in sorted(prefixes, key=len, reverse=True):
            if prefix != "quantcore" and _matches(module, prefix):
                if prefix.endswith(".*"):
                    return prefix[:-1] + module[len(prefix) - 1:].split(".")[0]
                return prefix
    return module


def violations(roots: Mapping[str, Path]) -> list[str]:
    """Every import that points up (or sideways between independent siblings), and every
    module no layer claims. Empty when the contract holds."""
    known = modules(roots)
    problems = [f"{m} ({p}) is in no layer: add it to tests/layers.py" for m, p in known.items()
                if layer_of(m) is None]
    for name, path in known.items():
        here = layer_of(name)
        if here is None:
            continue
        for imp in imports(name, path, known):
            there = layer_of(imp.imported)
            if imp.imported.split(".")[0] == TOOLS:
                problems.append(f"{imp}: tools/ is not installed; nothing in the package may import it")
            elif there is None:
                problems.append(f"{imp}: no such layer")
            elif there < here:
                problems.append(f"{imp}: points up ({_layer_name(here)} -> {_layer_name(there)})")
            elif there == here and LAYERS[here][1] and sibling_of(name) != sibling_of(imp.imported):
                problems.append(f"{imp}: {sibling_of(name)} and {sibling_of(imp.imported)} are independent")
    return list(dict.fromkeys(problems))  # one line per importing line and target


def entry_point_violations(root: Path = ROOT) -> list[str]:
    """Every entry point whose target sits above what its group's loader may import, and
    every group no rule covers."""
    highest = {group: layer_of(prefix.removesuffix(".*") + ".x" if prefix.endswith(".*") else prefix)
               for group, prefix in ENTRY_POINT_GROUPS.items()}
    problems = []
    for group, targets in entry_points(root).items():
        if group not in ENTRY_POINT_GROUPS:
            problems.append(f"entry-point group {group!r} is in no rule: add it to ENTRY_POINT_GROUPS in tests/layers.py")
            continue
        for name, target in targets.items():
            there, allowed = layer_of(target), highest[group]
            if there is None:
                problems.append(f"entry point {group}:{name} = {target}: no such layer")
            elif allowed is not None and there < allowed:
                problems.append(f"entry point {group}:{name} = {target}: points up (whoever loads {group!r} "
                                f"may reach {_layer_name(allowed)}, not {_layer_name(there)})")
    return problems


def cycles(roots: Mapping[str, Path]) -> list[list[str]]:
    """Groups of modules that import each other at run time (through any chain, imports
    inside functions included; ``TYPE_CHECKING`` imports excluded, they never run)."""
    known = modules(roots)
    graph = {m: sorted({i.imported for i in imports(m, p, known) if not i.typing_only and i.imported in known} - {m})
             for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def _layer_name(index: int) -> str:
    return " | ".join(p.removeprefix("quantcore.") for p in LAYERS[index][0])


def source_roots(root: Path = ROOT) -> dict[str, Path]:
    """The repository's folders, by the package-dir mapping."""
    return {package: root / folder for package, folder in package_dirs(root).items()}


def main() -> int:
    roots = source_roots()
    problems = (violations(roots) + entry_point_violations()
                + [f"import cycle: {' <-> '.join(c)}" for c in cycles(roots)])
    for p in problems:
        print(p)
    print(f"layers contract: {'broken, ' + str(len(problems)) + ' violation(s)' if problems else 'kept, no import cycles'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
