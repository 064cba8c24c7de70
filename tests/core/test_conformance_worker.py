"""A matrix worker's process settings (conformance/worker.py): one BLAS thread, large
tensors in huge pages, and a weight group's cache dropped once the group has run. The
process-wide settings are checked in a fresh interpreter each."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from quantcore.conformance import collect_cells
from quantcore.registry import Registry

from .fakes import Plugin, dense_kernel

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _run(source: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()


def test_one_blas_thread_limits_numpys_openblas() -> None:
    pytest.importorskip("threadpoolctl")
    found, threads = _run("""
        import numpy
        from threadpoolctl import threadpool_info
        from quantcore.conformance.worker import one_blas_thread
        found = one_blas_thread(1)
        print(found, max([i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"], default=0))
    """)
    if found == "False":
        pytest.skip("NumPy here is not built on OpenBLAS")
    assert threads == "1"


CHURN = """
import resource
import torch
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    t = torch.ones(16 * 2**20)  # 64 MiB, written, freed
    del t
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def test_large_tensors_fault_in_huge_pages() -> None:
    if not THP_MODE.exists() or "[never]" in THP_MODE.read_text():
        pytest.skip("this kernel offers no transparent huge pages")
    (plain,) = _run(CHURN)
    on, huge = _run("from quantcore.conformance.worker import huge_pages_for_tensors\n"
                    "print(huge_pages_for_tensors())\n" + CHURN)
    assert on == "True"
    pages = 4 * 64 * 2**20 // 4096  # four tensors of 64 MiB, in pages of 4 KiB
    if "[madvise]" in THP_MODE.read_text():  # huge pages only where asked for
        assert int(plain) >= pages // 2
    assert int(huge) < pages // 10


def test_a_worker_forgets_a_group_once_it_has_run(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.conformance import parallel, runner

    registry.register(Plugin(dense_kernel("dense")), "fake")
    cells = [c for c in collect_cells(formats=["gptq4-g32-asym"], kernels=["dense"], registry=registry)
             if "K128" in c.id][:3]
    monkeypatch.setattr(parallel, "_CELLS", cells)
    results = parallel._run_group([0, 1, 2])
    assert [r.status for _, r in results] == ["PASS"] * 3
    assert not runner._weights._data and not runner._prepared._data and not runner._inputs._data
