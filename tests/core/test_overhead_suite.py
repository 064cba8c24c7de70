"""The overhead suite's host-cost cases on the CPU (what CI records; times are not judged
here): every op family's kernels and modules beside nn.Linear and F.linear, Triton's kernels
left out with the reason, and the notes that set each against nn.Linear."""

from __future__ import annotations

import time

import torch

from quantcore.benchmarks.ceilings import Ceilings
from quantcore.benchmarks.runner import run_cases
from quantcore.benchmarks.suites._host_cost import host_times
from quantcore.benchmarks.suites.overhead import SHAPES, host_cases, host_notes


def test_the_host_time_of_a_call_is_the_time_to_issue_it() -> None:
    (timing, wall), = host_times([lambda i: time.sleep(0.002)], torch.device("cpu"), rounds=2, calls=3)
    assert 0.002 <= timing.median_s < 0.2 and wall >= timing.median_s and timing.method == "host-queue"


def test_host_cases_record_every_family_beside_the_dense_layer() -> None:
    shape = SHAPES["cpu"][0]
    cases = list(host_cases("cpu", [shape], (torch.bfloat16,), rounds=1))
    assert [c.label for c in cases] == ["host-M1-K128-N256-bfloat16"]  # no CUDA graphs on a CPU
    case = cases[0]
    roles = {v.name: v.role for v in case.variants}
    assert roles["nn.Linear"] == roles["F.linear"] == "peer"
    for name in ("QuantLinear(gptq4)", "TurboQuantLinear(tq4)", "QuantExperts(trtllm_moe)", "SVDQuantActQuant(nvfp4)",
                 "gptq4:aten_cpu", "turboquant4:turboquant_torch"):
        assert roles.get(name) == "kernel", (name, sorted(roles))
    assert all(v.measured is not None and v.measured.median_s > 0 for v in case.variants)
    for triton_kernel in ("triton_int4", "turboquant_triton", "trtllm_moe_triton", "triton_nvfp4"):
        assert case.skipped.get(triton_kernel), triton_kernel
    rows = run_cases(cases, "cpu", Ceilings("test", 1e9, 1e9, "test"), progress=False)
    (note,) = host_notes(rows)
    assert note.startswith("host-M1-K128-N256-bfloat16: nn.Linear ") and "QuantLinear(gptq4)" in note
