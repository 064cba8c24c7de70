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


def _with_triton(version: str | None) -> Capabilities:
    return dataclasses.replace(_cuda((9, 0)), packages=(PackageStatus("triton", version, True),))


def test_a_version_floor_refuses_an_older_release_with_the_reason() -> None:
    floor = dataclasses.replace(CUDA_AND_CPU, min_versions=(("triton", "3.6"),))
    assert floor.check(_with_triton("3.5.1")) == "package triton: 3.5.1 installed, needs 3.6 or newer"
    assert floor.check(_with_triton("3.2.0+git1a2b3c")) == "package triton: 3.2.0+git1a2b3c installed, needs 3.6 or newer"
    for same_or_newer in ("3.6", "3.6.0", "3.6.0+cu130", "3.6.1", "3.10.0", "4.0"):
        assert floor.check(_with_triton(same_or_newer)) is None, same_or_newer
    # no version to compare (a source checkout without metadata): the presence check decides
    assert floor.check(_with_triton(None)) is None


def test_every_triton_kernel_passes_over_a_triton_older_than_the_one_it_is_tested_with() -> None:
    from quantcore.registry import default_registry
    from quantcore.triton import TESTED_TRITON

    old = _with_triton("3.4.0")
    triton_kernels = [e.cls for e in default_registry().load().kernels() if "triton" in e.cls.requires.packages]
    assert {"hopper_wgmma", "triton_int4", "turboquant_triton", "trtllm_moe_triton", "triton_nvfp4"} <= {
        k.name for k in triton_kernels}
    for kernel in triton_kernels:
        assert TESTED_TRITON in kernel.requires.min_versions, kernel.name
        assert kernel.check_device(old) == f"package triton: 3.4.0 installed, needs {TESTED_TRITON[1]} or newer"


def test_a_version_ceiling_refuses_the_first_release_past_it() -> None:
    ceiling = dataclasses.replace(CUDA_AND_CPU, below_versions=(("triton", "3.7"),))
    assert ceiling.check(_with_triton("3.8.0")) == "package triton: 3.8.0 installed, needs a release below 3.7"
    assert ceiling.check(_with_triton("3.7")) == "package triton: 3.7 installed, needs a release below 3.7"
    assert ceiling.check(_with_triton("3.6.0")) is None and ceiling.check(_with_triton("3.6.9")) is None


def test_the_gluon_kernel_is_passed_over_on_a_triton_whose_gluon_it_does_not_compile_with() -> None:
    """Triton 3.8's Gluon has no ``gl.thread_barrier``: hopper_wgmma would fail at its first
    call there, so it is refused with the reason, and triton_int4 (plain Triton) is not."""
    from quantcore.registry import default_registry
    from quantcore.triton import GLUON_BELOW

    kernels = {e.cls.name: e.cls for e in default_registry().load().kernels() if e.cls.format == "gptq"}
    newer = _with_triton("3.8.0")
    assert kernels["hopper_wgmma"].check_device(newer) == (
        f"package triton: 3.8.0 installed, needs a release below {GLUON_BELOW[1]}")
    assert kernels["hopper_wgmma"].check_device(_with_triton("3.6.0")) is None
    assert kernels["triton_int4"].check_device(newer) is None
