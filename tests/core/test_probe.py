"""Probing: absence is an answer, results are cached, device names normalise."""

from __future__ import annotations

import pytest
import torch

from quantcore.probe import normalize_device, probe


def test_cpu_is_available_with_its_ops() -> None:
    caps = probe("cpu")
    assert caps.available and caps.device_type == "cpu"
    assert caps.has_op("_weight_int4pack_mm_for_cpu")
    assert caps.torch_version == torch.__version__


def test_xpu_only_op_is_not_reported_for_cpu() -> None:
    assert not probe("cpu").has_op("_weight_int4pack_mm_with_scales_and_zeros")


@pytest.mark.parametrize("device", ["cuda", "xpu", "npu", "cuda:7", "tpu"])
def test_absent_devices_are_answers(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("a CUDA device is present here")
    caps = probe(device)
    assert not caps.available and caps.reason


def test_cached_per_normalised_device() -> None:
    assert probe("cpu") is probe(torch.device("cpu")) is probe("CPU")


@pytest.mark.parametrize(
    ("given", "expected"),
    [("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda:1"), (torch.device("cuda", 2), "cuda:2"), ("npu:0", "npu:0")],
)
def test_normalize_device(given: object, expected: str) -> None:
    assert normalize_device(given) == expected  # type: ignore[arg-type]


def test_bad_device_string() -> None:
    with pytest.raises(ValueError, match="expected 'type' or 'type:index', got 'cuda:x'"):
        normalize_device("cuda:x")


def test_capabilities_render_for_doctor() -> None:
    rows = dict(probe("cpu").as_rows())
    assert rows["available"] == "yes" and "package triton" in rows
