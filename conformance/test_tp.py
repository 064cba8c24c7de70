"""The tensor-parallel matrix as tests: one per (case, kernel, dim, world), with the
matrix's own options (``--qc-device``, ``--qc-profile``, ``--qc-backend``, ``--qc-format``)."""

from __future__ import annotations

import pytest

from quantcore.conformance.runner import PASS, SKIP
from quantcore.conformance.tp import TPCell, collect_tp_cells, run_tp_cell


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tp_cell" not in metafunc.fixturenames:
        return
    opt = metafunc.config.getoption
    cells = collect_tp_cells(profile=opt("--qc-profile"), formats=opt("--qc-format"), kernels=opt("--qc-backend"))
    metafunc.parametrize(
        "tp_cell",
        [pytest.param(c, id=c.id, marks=pytest.mark.xdist_group(f"tp/{c.case.weight_key}")) for c in cells],
    )


def test_tp_cell(tp_cell: TPCell, qc_device: str) -> None:
    result = run_tp_cell(tp_cell, qc_device)
    if result.status == SKIP:
        pytest.skip(result.reason)
    assert result.status == PASS, f"{result.cell_id}: {result.reason}"
