"""The trtllm_moe bench suite builds its cases on CPU: kernels that run, refusals with
reasons, the bf16 peer; every variant runs once (no timing)."""

from __future__ import annotations

import torch

from quantcore.benchmarks.suites import get_suite


def test_small_case_has_kernels_peer_and_reasons() -> None:
    suite = get_suite("trtllm_moe")
    (case,) = list(suite.cases("cpu", suite.SHAPES["small"][:1]))
    names = {v.name: v for v in case.variants}
    assert {"trtllm_moe_torch", "bf16_per_expert"} <= set(names)
    assert "tensorrt_llm" in case.skipped and "cuda" in case.skipped["tensorrt_llm"]
    for v in case.variants:
        out = v.fn(0)
        assert out.shape in {(1, 2, 512), (2, 512)} and out.dtype == torch.bfloat16
        assert v.bytes > 0 and v.flops == 2 * 1 * 2 * 256 * 512
    notes = suite.summarize([
        {"variant": "trtllm_moe_triton", "role": "kernel", "dims": {"T": 1}, "case": "T1",
         "speedup_vs": {"bf16_per_expert": 1.8}, "copy_share": 0.8},
        {"variant": "trtllm_moe_triton", "role": "kernel", "dims": {"T": 16}, "case": "T16",
         "speedup_vs": {"bf16_per_expert": 1.9}, "copy_share": 0.79},
        {"variant": "trtllm_moe_triton", "role": "kernel", "dims": {"T": 4096}, "case": "T4096",
         "speedup_vs": {"bf16_per_expert": 0.89}, "copy_share": 0.1},
    ])
    assert notes == [
        "T1: 1.80× bf16 (target ≥ 1.8×), 80% of copy (target ≥ 80%): met",
        "T16: 1.90× bf16 (target ≥ 1.8×), 79% of copy (target ≥ 80%): missed",
        "T4096: 0.89× bf16 (target ≥ 0.9×): missed",
    ]
