"""The turboquant_offload suite's crossover search, without a GPU: the shape set, the
overlap model and the summary, on the H100 run committed under benchmarks/results."""

from __future__ import annotations

import json
from pathlib import Path

from quantcore.benchmarks.suites import get_suite

ROOT = Path(__file__).resolve().parents[2]
H100_RUN = ROOT / "benchmarks" / "results" / "nvidia-h100-80gb-hbm3" / "turboquant_offload.json"


def test_crossover_shapes_cover_the_default_ones_and_the_gap() -> None:
    suite = get_suite("turboquant_offload")
    ms = [s["M"] for s in suite.SHAPES["crossover"]]
    assert ms == sorted(ms) and len(set(ms)) == len(ms)
    assert {s["M"] for s in suite.SHAPES["default"]} <= set(ms)
    # the H100 run left the crossover between M = 128 (+38 %) and M = 2048 (+1.2 %)
    assert len([m for m in ms if 128 < m < 2048]) >= 6
    assert all((s["K"], s["N"], s["L"]) == (4096, 4096, 8) for s in suite.SHAPES["crossover"])


def test_overlap_model_and_crossover_rule() -> None:
    suite = get_suite("turboquant_offload")
    assert suite.predicted_overhead(1.0, 1.5) == 0.5
    assert suite.predicted_overhead(2.0, 1.0) == 0.0
    # every M from the crossover on must hold, so a late miss moves it up
    assert suite.crossover({1: 0.6, 128: 0.05, 512: 0.2, 2048: 0.01, 8192: 0.0}) == 2048
    assert suite.crossover({1: 0.6, 128: 0.09, 2048: 0.1}) == 128
    assert suite.crossover({1: 0.6, 8192: 0.3}) is None


def test_summary_of_the_h100_run() -> None:
    suite = get_suite("turboquant_offload")
    rows = json.loads(H100_RUN.read_text())["rows"]
    notes = suite.summarize(rows)
    assert notes[0].startswith("M1-K4096-N4096-L8: offload +553.0% over resident")
    assert "the overlap model predicts +605.1%" in notes[0]
    assert notes[-1] == ("K4096-N4096-L8: offload within +10% of resident from M = 1024 on (measured M: 1, 64, "
                         "128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 8192); the overlap model: from M = 1024 on")


def test_the_stack_is_prepared_for_the_activations_it_is_timed_with() -> None:
    """A layer made from a float32 nn.Linear without a dtype is prepared for float32: the
    suite would time float32 GEMMs against bf16 activations (on an H100, 10.6× and 12.5× the
    bf16 stack's resident time at M = 2048 and 8192:
    benchmarks/results/probes/turboquant_offload-float32-stack-nvidia-h100-80gb-hbm3.json)."""
    suite = get_suite("turboquant_offload")
    stack = suite.stack(256, 2, "cpu")
    assert [layer.dtype for layer in stack] == [suite.DTYPE, suite.DTYPE]
