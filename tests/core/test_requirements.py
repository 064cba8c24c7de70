"""Requirements: a kernel's device needs, compute capability floors included."""

from __future__ import annotations

import dataclasses

import torch

from quantcore.kernel import Requirements
from quantcore.probe import Capabilities, PackageStatus, probe

TRITON = PackageStatus("triton", "3.6.0", True)
CUDA_AND_CPU = Requirements(device_types=frozenset({"cuda", "cpu"}), min_capability=(8, 0), packages=("triton",))


def _cuda(cc: tuple[int, int]) -> Capabilities:
    return Capabilities(device="cuda:0", device_type="cuda", available=True, name="a GPU", compute_capability=cc,
                        torch_version=torch.__version__, packages=(TRITON,))


def test_a_capability_floor_holds_on_cuda() -> None:
    assert CUDA_AND_CPU.check(_cuda((9, 0))) is None
    assert CUDA_AND_CPU.check(_cuda((7, 5))) == "needs compute capability >= 8.0, device has 7.5"


def test_a_capability_floor_is_cudas_only() -> None:
    """A kernel that also runs on a CPU (Triton's interpreter) is not refused there for
    lacking a compute capability."""
    cpu = dataclasses.replace(probe("cpu"), packages=(TRITON,))
    assert cpu.compute_capability is None
    assert CUDA_AND_CPU.check(cpu) is None
