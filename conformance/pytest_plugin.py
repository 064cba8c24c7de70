"""pytest plugin (entry point ``pytest11``): the conformance cells as parametrised tests.

Options: ``--qc-device`` (default ``$QUANTCORE_DEVICE`` or cpu), ``--qc-profile``
(ci/full), ``--qc-backend`` and ``--qc-format`` (repeatable filters). Cells sharing
weights carry one ``xdist_group``, so with ``-n N --dist loadgroup`` each golden
quantization runs on one worker only. At the end the cells that ran are summarised as
the same formats × backends table ``quantcore conformance`` prints.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

_KEY = "quantcore_cell"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("quantcore", "quantcore conformance matrix")
    group.addoption("--qc-device", default=os.environ.get("QUANTCORE_DEVICE", "cpu"),
                    help="device the cells run on (cpu, cuda, cuda:1, xpu, npu)")
    group.addoption("--qc-profile", default=os.environ.get("QUANTCORE_PROFILE", "ci"),
                    choices=("ci", "full"), help="which case set: ci (bounded) or full")
    group.addoption("--qc-backend", action="append", default=[],
                    help="only these kernels or plugins (repeatable)")
    group.addoption("--qc-format", action="append", default=[],
                    help="only these formats, by name or slug (repeatable)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "xdist_group(name): cells sharing golden weights")
    device, formats, kernels = (config.getoption(o) for o in ("--qc-device", "--qc-format", "--qc-backend"))
    if device != "cpu" or formats or kernels:
        # An absent device or a name nothing is called is a usage error, never a run of
        # SKIPs or of nothing (which pytest would report as success).
        from quantcore.cli.arguments import check_device
        from quantcore.conformance.filters import check_filters, no_cells_message
        from quantcore.conformance.runner import collect_cells
        from quantcore.errors import InvalidArgumentError

        try:
            check_device(device, "--qc-device")
            check_filters(formats, kernels, format_option="--qc-format", kernel_option="--qc-backend")
        except InvalidArgumentError as exc:
            raise pytest.UsageError(str(exc)) from None
        if not collect_cells(profile=config.getoption("--qc-profile"), formats=formats, kernels=kernels):
            raise pytest.UsageError(no_cells_message(formats, kernels))
    if interpreter_wanted(device, _named(config, "--qc-device"), _cuda_present()):
        from quantcore.conformance.interpreter import enable_interpreter_for

        enable_interpreter_for(device)


def interpreter_wanted(device: str, named: bool, cuda_present: bool) -> bool:
    """Whether this session runs Triton under its interpreter: for CPU cells, unless the
    device was left at its default on a machine with a GPU — there the session also runs the
    GPU's own tests (compiled Triton, Gluon, inductor), which the interpreter would break
    for the whole process."""
    return str(device).split(":")[0] == "cpu" and (named or not cuda_present)


def _named(config: pytest.Config, option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in config.invocation_params.args)


def _cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "qc_cell" not in metafunc.fixturenames:
        return
    from quantcore.conformance.runner import collect_cells

    opt = metafunc.config.getoption
    cells = collect_cells(
        profile=opt("--qc-profile"), formats=opt("--qc-format"), kernels=opt("--qc-backend")
    )
    metafunc.parametrize(
        "qc_cell",
        [pytest.param(c, id=c.id, marks=pytest.mark.xdist_group(c.case.weight_key)) for c in cells],
    )


@pytest.fixture
def qc_device(request: pytest.FixtureRequest) -> str:
    return request.config.getoption("--qc-device")


def record(request: pytest.FixtureRequest, result: Any) -> None:
    """Attach a cell's result to its report, so the controller sees it under xdist too."""
    request.node.user_properties.append((_KEY, result.as_dict()))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" and not (report.when == "setup" and report.skipped):
        return
    for key, value in report.user_properties:
        if key == _KEY:
            _results.append(value)


_results: list[dict[str, Any]] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _results:
        return
    from quantcore.conformance.report import summary_table

    terminalreporter.write_sep("=", "quantcore conformance matrix")
    terminalreporter.write_line(summary_table(_results))
