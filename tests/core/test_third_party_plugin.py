"""The plugin path, proven by the example package in examples/ installed like a vendor's.

The README's test command installs it; without it this test fails on purpose, since a
silently skipped proof proves nothing.
"""

from __future__ import annotations

import importlib.metadata

import torch

from quantcore.conformance import collect_cells, run_cell
from quantcore.formats.gptq import GPTQ
from quantcore.problem import Problem
from quantcore.registry import Registry
from quantcore.selection import get_kernel

INSTALL = "pip install -e examples/quantcore-example-plugin"


def test_example_plugin_is_installed_as_a_distribution() -> None:
    dists = {ep.dist.name for ep in importlib.metadata.entry_points(group="quantcore") if ep.dist}
    assert "quantcore-example-plugin" in dists, f"the example plugin is not installed: {INSTALL}"


def test_example_plugin_loads_lists_and_runs_the_matrix() -> None:
    reg = Registry().load()
    info = {p.name: p for p in reg.plugins()}["example_zero_folding"]
    assert info.status == "ok" and info.kernels == ["zero_folding"]
    assert info.source.startswith("entry point quantcore-example-plugin")
    cells = [c for c in collect_cells(kernels=["zero_folding"], registry=reg) if "-K128-" in c.id]
    results = [run_cell(c) for c in cells]
    assert len(results) > 100 and all(r.status == "PASS" for r in results)
    p = Problem.linear(GPTQ(), M=1, K=128, N=256, dtype=torch.float32)
    assert get_kernel("gptq", "cpu", problem=p, prefer="zero_folding", registry=reg).name == "zero_folding"
