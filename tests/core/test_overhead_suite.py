"""The overhead suite's host-cost cases on the CPU (what CI records; times are not judged
here): every op family's kernels and modules beside nn.Linear and F.linear, Triton's kernels
left out with the reason, and the notes that set each against nn.Linear; a kernel that
encodes its weight's descriptors once beside its twin encoding them per call."""

from __future__ import annotations

import time
import types

import pytest
import torch

from quantcore.benchmarks.ceilings import Ceilings
from quantcore.benchmarks.runner import run_cases
from quantcore.benchmarks.suites._descriptors import DIFFER, per_call_twin
from quantcore.benchmarks.suites._host_cost import host_times
from quantcore.benchmarks.suites.overhead import SHAPES, host_cases, host_notes
from tests.triton_release import needs_tested_release


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


class _Bound:
    """A prepared weight's launch as a fake kernel binds it: with the descriptors encoded once
    (one encoding per call: x's) or per call (four), as the switch said at its first call."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.w = tensors["w"].clone()
        self.encodings: int | None = None


class _FakeKernel:
    def __init__(self, differ: bool) -> None:
        self.differ = differ

    def prepare(self, tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> _Bound:
        return _Bound(tensors)

    def __call__(self, x: torch.Tensor, p: _Bound) -> torch.Tensor:
        from triton.backends.nvidia import driver

        from quantcore.triton import launch

        if p.encodings is None:
            p.encodings = 1 if launch.ENCODE_FIXED_DESCRIPTORS_ONCE else 4
        desc = types.SimpleNamespace(base=p.w, shape=[4], strides=[1], padding="zero")
        for _ in range(p.encodings):
            driver.make_tensordesc_arg(desc, None)
        y = x * p.w
        return y.nextafter(y + 1) if self.differ and p.encodings == 4 else y


@needs_tested_release
@pytest.mark.parametrize("differ", [False, True])
def test_a_kernel_is_timed_beside_its_twin_with_descriptors_encoded_per_call(differ: bool) -> None:
    from quantcore.triton import launch

    tensors = {"w": torch.randn(4)}
    x = torch.randn(4).bfloat16()
    kernel = _FakeKernel(differ)
    prepared = kernel.prepare(tensors, torch.bfloat16)
    twin, twin_note, own_note = per_call_twin(kernel, tensors, x, prepared)
    assert launch.ENCODE_FIXED_DESCRIPTORS_ONCE  # restored
    assert own_note == "descriptors encoded per call: 1"
    assert twin_note.startswith("descriptors encoded per call: 4; ")
    assert (DIFFER in twin_note) is differ
    assert torch.equal(twin(0), kernel(x, kernel.prepare(tensors, torch.bfloat16))) is not differ
    rows = [{"case": "host-M1", "variant": v, "role": r, "time_s": t, "note": n}
            for v, r, t, n in (("nn.Linear", "peer", 1e-5, ""), ("k", "kernel", 1e-5, own_note),
                               ("k[descriptors per call]", "kernel", 2e-5, twin_note))]
    assert any(DIFFER in line for line in host_notes(rows)) is differ


def test_a_slow_spell_does_not_decide_a_paired_ratio() -> None:
    from quantcore.benchmarks.suites._host_cost import HostSamples

    # A 3× slow spell of the machine covers nn.Linear's slot in rounds 0–2 but the
    # kernel's only in rounds 0–1 (they run at different moments of a round): the ratio of
    # the medians says 0.4, the paired ratio the true 1.2.
    base = HostSamples((30e-6, 30e-6, 30e-6, 10e-6, 10e-6), (0.0,) * 5)
    mine = HostSamples((36e-6, 36e-6, 12e-6, 12e-6, 12e-6), (0.0,) * 5)
    assert mine.timing().median_s / base.timing().median_s == pytest.approx(0.4)
    assert mine.paired_ratio(base) == pytest.approx(1.2)
    # A cost that is really higher shows whole.
    twice = HostSamples(tuple(2 * t for t in base.host), (0.0,) * 5)
    assert twice.paired_ratio(base) == pytest.approx(2.0)


def test_the_held_queue_decides_where_it_was_measured() -> None:
    """On CUDA the host's own time is the queue issued while a spin kernel holds the GPU
    (``held``): a queue issued to a running GPU that met it (here 3× slower in two rounds)
    decides neither the timing nor the paired ratio; without held samples (a CPU) the
    running queue does."""
    from quantcore.benchmarks.suites._host_cost import HostSamples

    base = HostSamples((20e-6,) * 5, (0.0,) * 5, (20e-6,) * 5)
    met = HostSamples((60e-6, 60e-6, 24e-6, 24e-6, 24e-6), (0.0,) * 5, (24e-6,) * 5)
    assert met.timing().median_s == pytest.approx(24e-6) and met.timing().method == "host-held"
    assert met.paired_ratio(base) == pytest.approx(1.2)
    cpu = HostSamples((60e-6, 60e-6, 24e-6, 24e-6, 60e-6), (0.0,) * 5)
    assert cpu.issue == cpu.host and cpu.timing().median_s == pytest.approx(60e-6)
    assert cpu.timing().method == "host-queue"


def test_host_notes_judge_by_the_paired_ratio() -> None:
    from quantcore.benchmarks.suites.overhead import PAIRED, paired_ratio

    case = "host-M1-K8-N8-bfloat16"
    rows = [
        {"case": case, "variant": "nn.Linear", "role": "peer", "time_s": 10e-6, "note": f"dense; 1.000{PAIRED}"},
        # Its median is 1.5× nn.Linear's, but round by round it was 1.1×: within the target.
        {"case": case, "variant": "QuantLinear(gptq4)", "role": "kernel", "time_s": 15e-6,
         "note": f"module; wall 20.0 µs per call; 1.100{PAIRED}"},
        {"case": case, "variant": "K", "role": "kernel", "time_s": 11e-6, "note": f"kernel; 1.400{PAIRED}"},
    ]
    assert paired_ratio(rows[1]) == pytest.approx(1.1) and paired_ratio({"note": "kernel"}) is None
    (note,) = host_notes(rows)
    assert "over 1.3×: K;" in note and "QuantLinear(gptq4) 15.0 µs (1.10×)" in note


def test_host_cases_record_the_paired_ratio_of_every_subject() -> None:
    from quantcore.benchmarks.suites.overhead import paired_ratio

    (case,) = host_cases("cpu", [SHAPES["cpu"][0]], (torch.bfloat16,), rounds=2)
    rows = run_cases([case], "cpu", Ceilings("test", 1e9, 1e9, "test"), progress=False)
    ratios = {r["variant"]: paired_ratio(r) for r in rows if r["role"] != "skipped"}
    assert ratios["nn.Linear"] == pytest.approx(1.0)
    assert all(r is not None and r > 0 for r in ratios.values()), ratios
