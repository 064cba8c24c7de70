"""get_kernel chooses the fastest kernel for the shape by default, and says so: declared
costs move the choice with M, dense copies only when allowed or when nothing compressed
runs, priority for kernels that declare no cost, logging of choices and fallbacks."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from quantcore.binding import bind
from quantcore.errors import InvalidArgumentError
from quantcore.formats.gptq import GPTQ
from quantcore.problem import Problem
from quantcore.registry import Registry
from quantcore.selection import DENSE_HELD_BACK, ENV_ALLOW_DENSE, explain, get_kernel
from quantcore.selection.state import selection_state

from .fakes import Plugin, costed_kernel, dense_kernel

FMT = GPTQ(group_size=32)


def problem(m: int | None, k: int = 4096, n: int = 4096) -> Problem:
    return Problem.linear(FMT, M=m, K=k, N=n, dtype=torch.bfloat16)


@pytest.fixture(autouse=True)
def no_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared costs only: no cache, no shipped table."""
    import quantcore.measured as measured

    monkeypatch.setenv("QUANTCORE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(measured, "SHIPPED", tmp_path / "shipped")
    monkeypatch.delenv(ENV_ALLOW_DENSE, raising=False)


@pytest.fixture
def gemv_and_gemm(registry: Registry) -> Registry:
    """A GEMV-like kernel (fast streaming, slow math) and a GEMM-like one (the reverse),
    both priority 500 so they rank above the built-ins."""
    registry.register(Plugin(
        costed_kernel("gemv_like", bandwidth=0.9, compute=0.5, priority=500),
        costed_kernel("gemm_like", bandwidth=0.2, compute=1.0, priority=500),
    ), name="twokernels")
    return registry


def test_the_shape_moves_the_choice(gemv_and_gemm: Registry) -> None:
    assert get_kernel(FMT, "cpu", problem=problem(1), registry=gemv_and_gemm).name == "gemv_like"
    assert get_kernel(FMT, "cpu", problem=problem(512), registry=gemv_and_gemm).name == "gemm_like"
    expl = explain(FMT, "cpu", problem=problem(512), registry=gemv_and_gemm)
    rows = {c.kernel: c for c in expl.candidates}
    assert rows["gemm_like"].status == "selected" and rows["gemm_like"].reason.startswith("fastest estimated (")
    assert rows["gemv_like"].estimated_s > rows["gemm_like"].estimated_s
    assert "declared costs" in expl.basis
    # explain says where the choice moves, and the table shows it.
    by = dict(expl.by_batch)
    assert by[1] == "gemv_like" and by[4096] == "gemm_like"
    table = expl.table()
    assert "est. µs" in table and "chosen by M" in table and "M=1" in table and "gemm_like" in table


def test_undeclared_kernels_rank_by_priority_against_the_declared_block(registry: Registry) -> None:
    registry.register(Plugin(costed_kernel("costed", bandwidth=0.5, compute=0.5, priority=100),
                             dense_kernel("silent_low", priority=20)), name="p1")
    chosen = get_kernel(FMT, "cpu", problem=problem(1), registry=registry).name
    assert chosen in {"costed", "aten_cpu"}  # the block: decided by cost, not by silent_low
    rows = {c.kernel: c for c in explain(FMT, "cpu", problem=problem(1), registry=registry).candidates}
    assert rows["silent_low"].reason == "declares no cost: ranked by priority"
    registry.register(Plugin(dense_kernel("silent_high", priority=300)), name="p2")
    assert get_kernel(FMT, "cpu", problem=problem(1), registry=registry).name == "silent_high"
    expl = explain(FMT, "cpu", problem=problem(1), registry=registry)
    assert expl.selected.reason.startswith("highest priority (declares no cost)")


def test_dense_copy_only_when_allowed_or_nothing_else(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    # At M=64 the dense matmul is estimated faster than the int4 op on a CPU …
    p = problem(64)
    expl = explain(FMT, "cpu", problem=p, registry=registry)
    rows = {c.kernel: c for c in expl.candidates}
    assert rows["torch_fallback"].estimated_s < rows["aten_cpu"].estimated_s
    # … but it keeps a dense copy: not chosen by default, and explain says why.
    assert expl.selected.kernel == "aten_cpu"
    assert rows["torch_fallback"].keeps_dense and rows["torch_fallback"].reason == DENSE_HELD_BACK
    assert "dense copy" in expl.table() and "compressed" in expl.table()
    assert get_kernel(FMT, "cpu", problem=p, registry=registry).name == "aten_cpu"
    allowed = get_kernel(FMT, "cpu", problem=p, allow_dense=True, registry=registry)
    assert allowed.name == "torch_fallback"
    assert "a dense copy, allowed" in explain(FMT, "cpu", problem=p, allow_dense=True, registry=registry).selected.reason
    monkeypatch.setenv(ENV_ALLOW_DENSE, "1")
    assert get_kernel(FMT, "cpu", problem=p, registry=registry).name == "torch_fallback"
    monkeypatch.delenv(ENV_ALLOW_DENSE)
    # Nothing compressed can run (N % 16 != 0): the dense copy is the answer, and says so.
    odd = Problem.linear(FMT, M=1, K=4096, N=40)
    expl = explain(FMT, "cpu", problem=odd, registry=registry)
    assert expl.selected.kernel == "torch_fallback"
    assert "nothing that keeps it compressed can run" in expl.selected.reason
    # Named in prefer: the caller asked for it.
    assert get_kernel(FMT, "cpu", problem=p, prefer="torch_fallback", registry=registry).name == "torch_fallback"


def test_without_m_the_smallest_worst_slowdown_wins(registry: Registry) -> None:
    registry.register(Plugin(
        # 10 % faster at decode, hopeless at prefill …
        costed_kernel("decode_only", bandwidth=0.66, compute=0.5, priority=500),
        # … against a kernel near its best everywhere.
        costed_kernel("all_round", bandwidth=0.6, compute=1.0, priority=500),
    ), name="p")
    assert get_kernel(FMT, "cpu", problem=problem(1), registry=registry).name == "decode_only"
    no_m = problem(None)
    assert get_kernel(FMT, "cpu", problem=no_m, registry=registry).name == "all_round"
    expl = explain(FMT, "cpu", problem=no_m, registry=registry)
    assert "no M given: the smallest worst-case slowdown" in expl.selected.reason
    loser = next(c for c in expl.candidates if c.kernel == "decode_only")
    assert loser.reason.startswith("worst ") and "at M=4096" in loser.reason


def test_a_cost_that_raises_is_a_broken_kernel(registry: Registry) -> None:
    boom = costed_kernel("boom", bandwidth=1.0, compute=1.0, priority=900)
    boom.cost = classmethod(lambda cls, caps, problem: 1 / 0)  # type: ignore[method-assign]
    bad_share = costed_kernel("bad_share", bandwidth=1.0, compute=1.0, priority=900)
    from quantcore.cost import Cost

    bad_share.cost = classmethod(lambda cls, caps, problem: Cost(1.0, 1.0, bandwidth=0.0, compute=1.0))  # type: ignore[method-assign]
    not_a_cost = costed_kernel("not_a_cost", bandwidth=1.0, compute=1.0, priority=900)
    not_a_cost.cost = classmethod(lambda cls, caps, problem: 1e-6)  # type: ignore[method-assign]
    registry.register(Plugin(boom, bad_share, not_a_cost), name="p")
    rows = {c.kernel: c for c in explain(FMT, "cpu", problem=problem(1), registry=registry).candidates}
    assert rows["boom"].status == "refused" and "cost raised ZeroDivisionError" in rows["boom"].reason
    assert rows["bad_share"].status == "refused" and "Cost.bandwidth" in rows["bad_share"].reason
    assert rows["not_a_cost"].status == "refused" and "cost returned float" in rows["not_a_cost"].reason
    assert get_kernel(FMT, "cpu", problem=problem(1), registry=registry).name == "aten_cpu"
    assert ("gptq", "linear", "boom", "cpu") in selection_state(registry).failures


def test_a_cost_needing_a_missing_dim_is_no_estimate(registry: Registry) -> None:
    """Without K and N nobody can estimate: priorities decide, nothing is blamed."""
    expl = explain(FMT, "cpu", problem=Problem.linear(FMT, M=1), registry=registry)
    assert expl.selected.kernel == "aten_cpu" and expl.selected.reason.startswith("highest priority")
    assert not any(c.status == "refused" and "cost" in c.reason for c in expl.candidates)
    # A negative dim is the caller's mistake: refused when the problem is built, and no
    # kernel blamed for it.
    with pytest.raises(InvalidArgumentError, match=r"M: expected a size in \[0, 16777216\], got -3"):
        explain(FMT, "cpu", problem=Problem.linear(FMT, M=-3, K=4096, N=4096), registry=registry)
    assert not selection_state(registry).failures


def test_choice_is_logged_once_per_shape_class(registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="quantcore")
    for m in (3, 4, 3):  # one shape class (M rounds up to 4)
        get_kernel(FMT, "cpu", problem=problem(m, k=256, n=512), registry=registry)
    get_kernel(FMT, "cpu", problem=problem(5, k=256, n=512), registry=registry)  # M class 8
    chose = [r for r in caplog.records if r.name == "quantcore.selection" and r.levelno == logging.INFO]
    assert len(chose) == 2
    assert "chose aten_cpu for gptq4-g32-sym on cpu, K256-M4-N512" in chose[0].getMessage()
    assert "K256-M8-N512" in chose[1].getMessage()


def test_bind_logs_each_runtime_fallback_at_warning(registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    k = dense_kernel("flaky", priority=900)

    def prepare(self: Any, tensors: Any, *, dtype: Any = None) -> Any:
        raise RuntimeError("driver went away")

    k.prepare = prepare  # type: ignore[method-assign]
    registry.register(Plugin(k), name="vendor")
    caplog.set_level(logging.INFO, logger="quantcore")
    gen = torch.Generator().manual_seed(0)
    tensors = FMT.quantize(torch.randn(64, 128, generator=gen), generator=gen)
    bound = bind(FMT, "cpu", tensors, problem=Problem.linear(FMT, M=2, K=128, N=64, dtype=torch.float32),
                 registry=registry)
    assert bound.kernel.name == "aten_cpu"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].name == "quantcore.binding"
    assert "flaky prepare raised RuntimeError: driver went away" in warnings[0].getMessage()
    bound_info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("bound aten_cpu" in m and "after flaky failed" in m for m in bound_info)


def test_nothing_is_printed_by_default(tmp_path: Path) -> None:
    """INFO stays quiet under logging's defaults; only warnings reach stderr."""
    code = (
        "import torch, quantcore\n"
        "from quantcore.formats.gptq import GPTQ\n"
        "f = GPTQ(group_size=32)\n"
        "for m in (1, 64, 2048):\n"
        "    quantcore.get_kernel(f, 'cpu', problem=quantcore.Problem.linear(f, M=m, K=256, N=512))\n"
        "print(quantcore.explain(f, 'cpu').selected.kernel)\n"
    )
    env = {**os.environ, "QUANTCORE_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "aten_cpu" and out.stderr == ""
