"""The matrix itself: wrong kernels FAIL, refusing ones SKIP with the reason, and the
tolerance catches the errors it is there to catch."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch

from quantcore.conformance import collect_cells, run_cell
from quantcore.conformance.report import counts, summary_table, to_json
from quantcore.conformance.tolerance import compare, tolerance_for
from quantcore.registry import Registry

from .fakes import Plugin, dense_kernel, refusing_kernel

SMALL = "gptq4-g32-asym"


def cells_of(registry: Registry, kernel: str) -> list:
    """The kernel's cells on the small shape (the large ones belong to the matrix run)."""
    cells = collect_cells(formats=[SMALL], kernels=[kernel], registry=registry)
    return [c for c in cells if "-K128-" in c.id]


def test_cells_are_every_case_times_every_kernel(registry: Registry) -> None:
    cells = collect_cells(formats=[SMALL], registry=registry)
    kernels = {c.kernel.cls.name for c in cells}
    assert kernels == {"aten_cpu", "aten_cuda", "aten_xpu", "hopper_wgmma", "torch_fallback", "triton_int4"}
    ids = [c.id for c in cells]
    assert len(ids) == len(set(ids))
    assert "gptq4-g32-asym/aten_cpu/M1-K4096-N4096/bf16" in ids
    assert "gptq4-g32-asym/torch_fallback/M7-K128-N256+bias/fp16" in ids


def test_full_profile_is_a_superset(registry: Registry) -> None:
    ci = {c.id for c in collect_cells(registry=registry)}
    full = {c.id for c in collect_cells(profile="full", registry=registry)}
    assert ci < full


def test_a_wrong_kernel_fails(registry: Registry) -> None:
    registry.register(Plugin(dense_kernel("off_by_a_bit", scale=1.02)), name="wrong")
    results = [run_cell(c) for c in cells_of(registry, "off_by_a_bit")[:6]]
    assert results and all(r.status == "FAIL" for r in results)
    assert "rel" in results[0].reason and "tol" in results[0].reason


def test_a_correct_kernel_passes(registry: Registry) -> None:
    registry.register(Plugin(dense_kernel("exact")), name="exact")
    results = [run_cell(c) for c in cells_of(registry, "exact")[:6]]
    assert all(r.status == "PASS" for r in results), [r.reason for r in results]


def test_refusal_is_skip_with_reason(registry: Registry) -> None:
    registry.register(Plugin(refusing_kernel("picky", "needs Blackwell")), name="picky")
    (first, *_) = [run_cell(c) for c in cells_of(registry, "picky")[:3]]
    assert first.status == "SKIP" and first.reason == "needs Blackwell"


def test_raising_prepare_is_fail_with_the_error(registry: Registry) -> None:
    k = dense_kernel("crashy")

    def prepare(self, tensors, *, dtype=None):
        raise RuntimeError("segfault avoided")

    k.prepare = prepare
    registry.register(Plugin(k), name="crashy")
    r = run_cell(cells_of(registry, "crashy")[0])
    assert r.status == "FAIL" and "prepare raised RuntimeError: segfault avoided" in r.reason


def test_wrong_output_dtype_fails(registry: Registry) -> None:
    k = dense_kernel("upcaster")
    k.__call__ = lambda self, x, p: x.float() @ p.T  # type: ignore[method-assign]
    registry.register(Plugin(k), name="upcaster")
    results = [run_cell(c) for c in cells_of(registry, "upcaster") if c.case.act_dtype != torch.float32][:2]
    assert results[0].status == "FAIL" and "output dtype" in results[0].reason


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_tolerance_catches_one_wrong_column(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 4096, generator=gen, dtype=torch.float64)
    out = ref.clone()
    out[:, 17] *= -1  # one output feature of 4096 with its sign flipped
    verdict = compare(out.to(dtype), ref, tolerance_for(dtype))
    assert not verdict.ok and verdict.max_err > tolerance_for(dtype).max


def test_tolerance_rejects_nan_and_shape() -> None:
    tol = tolerance_for(torch.bfloat16)
    ref = torch.randn(4, 8, dtype=torch.float64)
    bad = ref.clone()
    bad[1, 2] = float("nan")
    assert "non-finite" in compare(bad, ref, tol).problem
    assert "shape" in compare(ref[:, :4], ref, tol).problem


def test_tolerance_reads_a_golden_made_on_the_kernels_device(qc_device: str) -> None:
    """A harness may compute the float64 golden beside the kernel, on its device; the
    judgement is the same as with both on the CPU (on a CPU run the devices agree)."""
    ref = torch.randn(64, 4096, dtype=torch.float64)
    out = ref.to(torch.bfloat16)
    out[:, 17] *= -1
    tol = tolerance_for(torch.bfloat16)
    on_cpu = compare(out, ref, tol)
    for o, r in ((out.to(qc_device), ref.to(qc_device)), (out, ref.to(qc_device)), (out.to(qc_device), ref)):
        verdict = compare(o, r, tol)
        assert not verdict.ok and (verdict.rel_err, verdict.max_err) == (on_cpu.rel_err, on_cpu.max_err)


def test_tolerance_accepts_plain_rounding() -> None:
    ref = torch.randn(64, 4096, dtype=torch.float64)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert compare(ref.to(dtype), ref, tolerance_for(dtype)).ok


def test_report_table_and_json(registry: Registry) -> None:
    registry.register(Plugin(refusing_kernel("picky", "needs Blackwell")), name="picky")
    results = [run_cell(c) for c in collect_cells(formats=[SMALL], registry=registry) if "K128" in c.id]
    table = summary_table(results)
    assert "aten_cpu" in table and "picky" in table and "needs Blackwell" in table
    assert counts(results)["SKIP"] >= 1 and counts(results)["FAIL"] == 0
    data = json.loads(to_json(results, device="cpu"))
    assert data["counts"] == counts(results) and len(data["cells"]) == len(results)


def test_the_default_summary_fits_a_terminal_however_many_kernels() -> None:
    """136 format variants × 15 kernels made the old table 325 columns wide; the default
    layout is one line per (family, kernel) pair, as wide as its longest names."""
    kernels = [f"kernel_{i:02d}_with_a_longish_name"[:18] for i in range(15)]
    formats = [f"gptq{b}-g{g}-{s}" for b in (2, 3, 4, 8) for g in (32, 64, 128, -1) for s in ("sym", "asym")]
    rows = [{"format": f, "kernel": k, "status": "PASS" if i % 3 else "SKIP", "rel_err": 1e-3,
             "reason": "" if i % 3 else f"{k}: runs on cuda, not cpu", "shape": "M1", "dtype": "bf16"}
            for i, (f, k) in enumerate((f, k) for f in formats for k in kernels)]
    for group in ("family", "format"):
        table = summary_table(rows, group=group).split("\n\n")[0]
        assert max(len(line) for line in table.splitlines()) <= 100, table
    wide = summary_table(rows, group="format", layout="matrix").split("\n\n")[0]
    assert max(len(line) for line in wide.splitlines()) > 200  # the matrix is still there on request


def test_worker_processes_give_the_results_of_one_process(registry: Registry) -> None:
    """quantcore conformance -j 2: the same result for every cell, in the cells' order."""
    from quantcore.conformance.parallel import run_cells

    cells = [c for c in collect_cells(formats=[SMALL], registry=registry) if "K128" in c.id][:24]
    seen: list[str] = []
    parallel = run_cells(cells, jobs=2, done=lambda cell, result: seen.append(result.cell_id))
    serial = [run_cell(c) for c in cells]
    assert [r.cell_id for r in parallel] == [c.id for c in cells] and sorted(seen) == sorted(c.id for c in cells)
    assert [(r.status, r.rel_err, r.reason) for r in parallel] == [(r.status, r.rel_err, r.reason) for r in serial]
    assert {r.status for r in parallel} >= {"PASS", "SKIP"}


def _dies_on_its_first_group(indices: list[int]) -> Any:
    from quantcore.conformance import parallel

    if 0 in indices:
        os._exit(1)  # a worker killed mid-group (the OOM killer, a native crash)
    return parallel._run_one_group(indices)


def test_a_dead_worker_loses_no_cell(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantcore.conformance import parallel

    cells = [c for c in collect_cells(formats=[SMALL], registry=registry) if "K128" in c.id][:12]
    monkeypatch.setattr(parallel, "_run_one_group", parallel._run_group, raising=False)
    monkeypatch.setattr(parallel, "_run_group", _dies_on_its_first_group)
    results = parallel.run_cells(cells, jobs=2)
    assert [r.cell_id for r in results] == [c.id for c in cells]
    assert [r.status for r in results] == [run_cell(c).status for c in cells]


def test_a_process_with_cuda_initialised_runs_its_cells_itself(
    registry: Registry, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A forked child of a process that initialised CUDA inherits the driver's state: the
    workers of a GPU test process hung. There the cells run in the process itself."""
    from quantcore.conformance import parallel

    def no_pool(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("forked workers in a process with CUDA initialised")

    cells = [c for c in collect_cells(formats=[SMALL], registry=registry) if "K128" in c.id][:6]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(parallel, "ProcessPoolExecutor", no_pool)
    results = parallel.run_cells(cells, jobs=2)
    assert [(r.cell_id, r.status) for r in results] == [(c.id, run_cell(c).status) for c in cells]
    assert "cannot fork its workers safely" in capsys.readouterr().err
