"""The tensor-parallel matrix and the suite's plumbing catch what they must."""

from __future__ import annotations

import pytest
import torch

import quantcore.conformance.tp.runner as tp_runner
from quantcore.benchmarks.ceilings import Ceilings
from quantcore.benchmarks.runner import run_cases
from quantcore.benchmarks.spec import BenchCase, Variant
from quantcore.conformance.runner import FAIL, PASS, SKIP
from quantcore.conformance.tp import collect_tp_cells, run_tp_cell
from quantcore.timing import Timing


def _cell(fmt_slug: str, kernel: str, dim: str, world: int):
    cells = collect_tp_cells(formats=[fmt_slug], kernels=[kernel])
    return next(c for c in cells if c.dim == dim and c.world == world and c.case.act_dtype == torch.bfloat16)


def test_every_format_family_and_dim_is_in_the_matrix():
    cells = collect_tp_cells()
    seen = {(c.case.format.name, c.dim, c.world) for c in cells}
    for name, dims in {"gptq": "KN", "awq": "KN", "turboquant": "KN", "trtllm_moe": "KNE", "svdquant": "N"}.items():
        assert {(name, d, w) for d in dims for w in (2, 4)} <= seen, name


def test_a_passing_cell_and_a_wrong_combination_that_fails(monkeypatch):
    cell = _cell("gptq4-g128-sym", "torch_fallback", "N", 2)
    assert run_tp_cell(cell).status == PASS
    real = tp_runner.combine
    monkeypatch.setattr(tp_runner, "combine", lambda op, dim, outs, calls: real(op, dim, list(reversed(outs)), calls))
    result = run_tp_cell(cell)
    assert result.status == FAIL and "rel" in result.reason


def test_a_shard_that_drops_the_bias_fails(monkeypatch):
    cell = _cell("gptq4-g128-sym", "torch_fallback", "K", 2)
    real = tp_runner.Shard
    fmt_cls = type(cell.case.format)
    original = fmt_cls.shard_tensors

    def no_bias(self, tensors, **kw):
        s = original(self, tensors, **kw)
        return real(**{**s.__dict__, "tensors": {k: v for k, v in s.tensors.items() if k != "bias"}})

    monkeypatch.setattr(fmt_cls, "shard_tensors", no_bias)
    assert run_tp_cell(cell).status == FAIL


def test_a_kernel_that_refuses_act_order_row_shards_is_a_skip_with_the_reason():
    result = run_tp_cell(_cell("gptq4-g128-asym-act", "aten_cpu", "K", 2))
    assert result.status == SKIP and "prepare refused a shard" in result.reason


def test_the_runner_reports_variants_measured_by_the_ranks():
    case = BenchCase("tp_linear", "M1", {"M": 1})
    never = lambda i: pytest.fail("a measured variant is not called")  # noqa: E731
    case.variants.append(Variant("tp2_mlp", "kernel", never, 1000, 10, measured=Timing(2e-3, 0.1, 7, "lockstep")))
    case.variants.append(Variant("unsharded_mlp", "peer", never, 1000, 10, measured=Timing(3e-3, 0.1, 7, "lockstep")))
    rows = run_cases([case], "cpu", Ceilings("test", 1e9, 1e9, "test"), progress=False)
    tp = next(r for r in rows if r["variant"] == "tp2_mlp")
    assert tp["time_s"] == 2e-3 and tp["speedup_vs"]["unsharded_mlp"] == pytest.approx(1.5)


def test_shared_gpus_deal_the_ranks_round_robin(monkeypatch):
    from quantcore.checkpoint.launch import _device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [_device("cuda:shared", r) for r in range(4)] == [torch.device("cuda", i) for i in (0, 1, 0, 1)]
    assert _device("cuda:rank", 3) == torch.device("cuda", 3) and _device("cuda", 3) == torch.device("cuda", 0)


def test_the_suite_splits_eager_and_graph_timings_into_cases(monkeypatch, tmp_path):
    """What the ranks report becomes one case per mode; a variant the graph cannot hold
    (a host all-reduce) is a skip with its reason; the summary gives both speed-ups."""
    import quantcore.benchmarks.suites.tp_linear as suite

    def row(name, role, mode, t):
        return {"name": name, "role": role, "mode": mode, "time_s": t, "spread": 0.1, "bytes": 1, "flops": 1, "note": ""}

    variants = [row("tp2_mlp", "kernel", "eager", 2e-4), row("all_reduce", "peer", "eager", 5e-5),
                row("unsharded_mlp", "peer", "eager", 3e-4), row("tp2_mlp", "kernel", "graph", 1e-4),
                row("unsharded_mlp", "peer", "graph", 2e-4),
                {"name": "all_reduce", "role": "skipped", "mode": "graph", "note": "a gloo all-reduce runs on the host"}]
    data = {"backend": "nccl", "device": "cuda:0", "kernels": {}, "cases": [{"M": 1, "variants": variants}]}
    monkeypatch.setattr(suite, "run_group", lambda *a, **k: data)
    cases = list(suite.cases("cuda", [{"M": 1, "K": 8192, "N": 28672, "W": 2}]))
    assert [c.label for c in cases] == ["M1-K8192-N28672-W2", "M1-K8192-N28672-W2-graph"]
    assert [v.name for v in cases[1].variants] == ["tp2_mlp", "unsharded_mlp"]
    assert "host" in cases[1].skipped["all_reduce"] and cases[1].variants[0].measured.method == "lockstep-graph"
    rows = run_cases(cases, "cpu", Ceilings("test", 1e9, 1e9, "test"), progress=False)
    notes = suite.summarize(rows)
    assert notes[0].startswith("M1-K8192-N28672-W2: 2 ranks 1.50×") and "25%" in notes[0]
    assert notes[1].startswith("M1-K8192-N28672-W2-graph: 2 ranks 2.00×") and "not timed alone" in notes[1]


def test_the_suite_reports_the_one_shot_all_reduce_and_what_auto_picks(monkeypatch, tmp_path):
    """One-shot rows become variants of the same case; the all-reduce row auto picks says
    so; the summary and the probe's table give the speed-up with each path."""
    import quantcore.benchmarks.suites.tp_linear as suite
    from tools.probes.host_cost_table import tp_lines

    def row(name, role, t):
        return {"name": name, "role": role, "mode": "graph", "time_s": t, "spread": 0.1, "bytes": 1, "flops": 1, "note": ""}

    def case(m, auto):
        return {"M": m, "auto": auto, "variants": [
            row("tp2_mlp", "kernel", 120e-6), row("all_reduce", "peer", 24e-6), row("unsharded_mlp", "peer", 180e-6),
            row("tp2_mlp_one_shot", "kernel", 100e-6), row("all_reduce_one_shot", "peer", 5e-6)]}

    data = {"backend": "nccl", "device": "cuda:0", "kernels": {}, "cases": [case(1, "one_shot"), case(128, "backend")]}
    monkeypatch.setattr(suite, "run_group", lambda *a, **k: data)
    cases = list(suite.cases("cuda", [{"M": m, "K": 8192, "N": 28672, "W": 2} for m in (1, 128)]))
    picked = [[v.name for v in c.variants if suite.AUTO_PICKS in v.note] for c in cases]
    assert picked == [["all_reduce_one_shot"], ["all_reduce"]]
    rows = run_cases(cases, "cpu", Ceilings("test", 1e9, 1e9, "test"), progress=False)
    notes = suite.summarize(rows)
    assert "2 ranks 1.50×" in notes[0] and "20% of the block's time" in notes[0]
    assert "with the one-shot all-reduce 1.80×, the all-reduce 5% of it; auto picks one-shot" in notes[0]
    assert notes[1].endswith("auto picks the backend")
    lines = tp_lines(rows)
    assert "speed-up 1.50×" in lines[0] and "one-shot: tp    100.0 µs  speed-up 1.80×  all-reduce 5%" in lines[0]
    assert lines[0].endswith("auto: one-shot") and lines[1].endswith("auto: backend")


def test_the_suite_reports_gate_and_up_fused_against_two_launches(monkeypatch):
    """The ``…_unfused`` rows are variants of the same case (so ``tp2_mlp`` stays the
    block the summary reads); the summary gives the fused block's speed-up over them."""
    import quantcore.benchmarks.suites.tp_linear as suite

    def row(name, role, t):
        return {"name": name, "role": role, "mode": "graph", "time_s": t, "spread": 0.1, "bytes": 1, "flops": 1, "note": ""}

    variants = [row("tp2_mlp", "kernel", 80e-6), row("tp2_local", "peer", 70e-6),
                row("tp2_mlp_unfused", "peer", 100e-6), row("tp2_local_unfused", "peer", 90e-6),
                row("unsharded_mlp", "peer", 120e-6), row("unsharded_mlp_unfused", "peer", 132e-6)]
    data = {"backend": "nccl", "device": "cuda:0", "kernels": {}, "unfused_why": "", "cases": [{"M": 1, "variants": variants}]}
    monkeypatch.setattr(suite, "run_group", lambda *a, **k: data)
    cases = list(suite.cases("cuda", [{"M": 1, "K": 8192, "N": 28672, "W": 2}]))
    assert [v.name for v in cases[0].variants] == [v["name"] for v in variants]
    assert "gate and up as one launch per rank" in cases[0].variants[0].note
    notes = suite.summarize(run_cases(cases, "cpu", Ceilings("test", 1e9, 1e9, "test"), progress=False))
    assert "2 ranks 1.50×" in notes[0]  # tp2_mlp, not the unfused row
    assert "gate and up fused 1.25× the two launches (1.10× unsharded)" in notes[0]
    from tools.probes.host_cost_table import tp_lines

    assert tp_lines(run_cases(cases, "cpu", Ceilings("test", 1e9, 1e9, "test"), progress=False))[0].endswith(
        "gate/up apart: tp    100.0 µs  fused 1.25×")
    data["unfused_why"] = "the x format defines no concatenation along N"
    apart = list(suite.cases("cuda", [{"M": 1, "K": 8192, "N": 28672, "W": 2}]))
    assert "gate and up apart: the x format defines no concatenation along N" in apart[0].variants[0].note


def test_the_suite_reports_the_host_cost_of_the_block_and_its_parts(monkeypatch):
    """Host rows (``mode: "host"``) are a case of their own, ``…-host``; the probe's table
    gives the block's host µs beside the unsharded block's and each part's (the
    activation as what ``hidden`` adds to gate/up)."""
    import quantcore.benchmarks.suites.tp_linear as suite
    from tools.probes.host_cost_table import tp_lines

    def row(name, mode, t):
        return {"name": name, "role": "peer", "mode": mode, "time_s": t, "spread": 0.1, "bytes": 1, "flops": 1, "note": ""}

    variants = [row("tp2_mlp", "eager", 150e-6), row("unsharded_mlp", "eager", 140e-6),
                row("tp2_mlp", "host", 100e-6), row("unsharded_mlp", "host", 90e-6), row("tp2_gate_up", "host", 30e-6),
                row("tp2_hidden", "host", 50e-6), row("tp2_down", "host", 28e-6)]
    data = {"backend": "nccl", "device": "cuda:0", "kernels": {}, "cases": [{"M": 1, "variants": variants}]}
    monkeypatch.setattr(suite, "run_group", lambda *a, **k: data)
    cases = list(suite.cases("cuda", [{"M": 1, "K": 8192, "N": 28672, "W": 2}]))
    assert [c.label for c in cases] == ["M1-K8192-N28672-W2", "M1-K8192-N28672-W2-host"]
    assert [v.name for v in cases[1].variants] == ["tp2_mlp", "unsharded_mlp", "tp2_gate_up", "tp2_hidden", "tp2_down"]
    assert all(v.measured.method == "lockstep-host" and "spin kernel" in v.note for v in cases[1].variants)
    lines = tp_lines(run_cases(cases, "cpu", Ceilings("test", 1e9, 1e9, "test"), progress=False))
    assert "parts" not in lines[0]
    assert lines[1].startswith("M1-K8192-N28672-W2-host") and "tp    100.0 µs" in lines[1]
    assert lines[1].endswith("parts: gate/up 30.0  act 20.0  down 28.0 µs")
