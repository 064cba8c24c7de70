"""When the conformance plugin turns Triton's interpreter on for a test session: for CPU
cells, but never by default on a machine with a GPU, where the same session runs the GPU's
compiled kernels (the interpreter would silently take over inductor's and break Gluon's)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from quantcore.conformance.pytest_plugin import interpreter_wanted


@pytest.mark.parametrize(("device", "named", "cuda", "wanted"), [
    ("cpu", False, False, True),   # CI: no GPU, the default device
    ("cpu", True, False, True),
    ("cpu", True, True, True),     # asked for CPU cells on a GPU machine
    ("cpu", False, True, False),   # a GPU machine running its tests with the default device
    ("cuda", True, True, False),
    ("cuda:0", True, True, False),
])
def test_the_interpreter_is_on_for_cpu_cells_only_when_asked_or_without_a_gpu(
        device: str, named: bool, cuda: bool, wanted: bool) -> None:
    assert interpreter_wanted(device, named, cuda) is wanted


def _sets_the_interpreter(tree: ast.AST) -> bool:
    """A call of ``enable_interpreter_for`` or an assignment to ``os.environ["TRITON_INTERPRET"]``
    (in code: a script a test hands to a subprocess is a string)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")) == "enable_interpreter_for":
                return True
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (isinstance(target, ast.Subscript) and getattr(target.value, "attr", "") == "environ"
                        and isinstance(target.slice, ast.Constant) and target.slice.value == "TRITON_INTERPRET"):
                    return True
    return False


def test_no_test_module_turns_the_interpreter_on_for_its_process() -> None:
    """The plugin's choice is the session's: a test module that turned Triton's interpreter
    on would run every later compiled kernel of a GPU session (inductor's too) on the host.
    A module reads the choice (``tests/interpreting.py``); only a subprocess may make its own."""
    tests = Path(__file__).resolve().parents[1]
    subprocess_mains = {"hardening/determinism_digest.py"}
    offenders = sorted(rel for path in tests.rglob("*.py")
                       if (rel := str(path.relative_to(tests))) not in subprocess_mains
                       and _sets_the_interpreter(ast.parse(path.read_text())))
    assert not offenders, f"set Triton's interpreter for the whole process: {offenders}"
