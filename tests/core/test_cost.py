"""quantcore.cost: the roofline a kernel declares, and the shape classes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from quantcore.cost import (
    Cost,
    DeviceRates,
    batch_dim,
    device_rates,
    grouped_weight_bytes,
    linear_cost,
    shape_class,
    with_batch,
)
from quantcore.formats.gptq import GPTQ
from quantcore.formats.trtllm_moe import TRTLLMMoE
from quantcore.ops.moe import moe_problem
from quantcore.probe import probe
from quantcore.problem import Problem

RATES = DeviceRates(copy_bytes_per_s=1e12, matmul_flops_per_s=1e14, launch_s=1e-6, source="test")


def test_seconds_is_the_roofline_plus_launches() -> None:
    c = Cost(bytes=1e6, flops=1e9, bandwidth=0.5, compute=0.25, launches=2)
    assert c.memory_s(RATES) == pytest.approx(2e-6)
    assert c.compute_s(RATES) == pytest.approx(4e-5)
    assert c.seconds(RATES) == pytest.approx(2e-6 + 4e-5)
    assert c.bound(RATES) == "compute"
    assert Cost(1e9, 1.0, 1.0, 1.0).bound(RATES) == "memory"
    assert Cost(1.0, 1.0, 1.0, 1.0, launches=3).bound(RATES) == "launch"


def test_a_stream_rate_caps_the_bandwidth_share() -> None:
    """A latency-bound kernel takes the same time on a card with twice the bandwidth; below
    its rate, the share of the card's bandwidth rules."""
    fast = dataclasses.replace(RATES, copy_bytes_per_s=2 * RATES.copy_bytes_per_s)
    capped = Cost(bytes=1e6, flops=1.0, bandwidth=0.8, compute=1.0, stream_bytes_per_s=5e11)
    assert capped.memory_s(RATES) == pytest.approx(2e-6) and capped.memory_s(fast) == pytest.approx(2e-6)
    free = Cost(bytes=1e6, flops=1.0, bandwidth=0.8, compute=1.0)
    assert free.memory_s(fast) == pytest.approx(free.memory_s(RATES) / 2)
    slow = dataclasses.replace(RATES, copy_bytes_per_s=RATES.copy_bytes_per_s / 4)
    assert capped.memory_s(slow) == pytest.approx(1e6 / (0.8 * slow.copy_bytes_per_s))
    p = Problem.linear(GPTQ(), M=1, K=256, N=256, dtype=torch.bfloat16)
    assert linear_cost(p, 1e6, bandwidth=1.0, compute=1.0, stream_bytes_per_s=5e11).stream_bytes_per_s == 5e11


@pytest.mark.parametrize("rate", [0, -1.0, float("nan")])
def test_a_stream_rate_must_be_positive(rate: float) -> None:
    with pytest.raises(ValueError, match=r"Cost\.stream_bytes_per_s: expected a rate > 0"):
        Cost(1.0, 1.0, 1.0, 1.0, stream_bytes_per_s=rate)


@pytest.mark.parametrize("share", [0, -0.5, float("nan"), float("inf")])
def test_a_share_must_be_positive_and_finite(share: float) -> None:
    with pytest.raises(ValueError, match=r"Cost\.bandwidth: expected a share > 0"):
        Cost(1.0, 1.0, bandwidth=share, compute=1.0)


def test_negative_bytes_are_refused() -> None:
    with pytest.raises(ValueError, match="bytes, flops and launches must be >= 0"):
        Cost(-1.0, 1.0, 1.0, 1.0)


def test_linear_cost_counts_weight_activation_and_output() -> None:
    p = Problem.linear(GPTQ(), M=2, K=8, N=4, dtype=torch.bfloat16)
    c = linear_cost(p, 100.0, bandwidth=1.0, compute=1.0)
    assert c.bytes == 100 + 2 * (2 * 8 + 2 * 4) and c.flops == 2 * 2 * 8 * 4
    assert grouped_weight_bytes(256, 16, 4, 128, scale_bytes=2, zero_bits=4) == 256 * 16 / 2 + 2 * 16 * (2 + 0.5)


def test_shape_class_rounds_the_batch_dim_of_each_op() -> None:
    p = Problem.linear(GPTQ(), M=17, K=8, N=8)
    assert batch_dim(p) == "M" and shape_class(p) == "K8-M32-N8"
    moe = moe_problem(TRTLLMMoE(), T=3, E=8, topk=2, K=256, N=512)
    assert batch_dim(moe) == "T" and shape_class(moe) == "E8-K256-N512-T4-topk2"
    assert with_batch(Problem.linear(GPTQ(), K=8, N=8), 64)["M"] == 64
    assert with_batch(moe, 9)["T"] == 9 and with_batch(moe, 9).op == "moe"


def test_rates_measured_for_known_devices_nominal_otherwise() -> None:
    cpu = device_rates(probe("cpu"))
    assert cpu.source.startswith("nominal") and cpu.copy_bytes_per_s > 0
    h100 = dataclasses.replace(probe("cpu"), device_type="cuda", name="NVIDIA H100 80GB HBM3")
    assert device_rates(h100).source.startswith("measured") and device_rates(h100).copy_bytes_per_s == 3.0e12
    h200 = dataclasses.replace(h100, name="NVIDIA H200")  # its ceilings in benchmarks/results/nvidia-h200
    assert device_rates(h200).source.startswith("measured") and device_rates(h200).copy_bytes_per_s == 4.24e12
    odd = dataclasses.replace(probe("cpu"), device_type="quantum", name="?")
    assert device_rates(odd).matmul_flops_per_s > 0
