"""When the conformance plugin turns Triton's interpreter on for a test session: for CPU
cells, but never by default on a machine with a GPU, where the same session runs the GPU's
compiled kernels (the interpreter would silently take over inductor's and break Gluon's)."""

from __future__ import annotations

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
