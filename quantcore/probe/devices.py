"""One prober per device type. Each returns Capabilities and never raises for absence."""

from __future__ import annotations

import contextlib
import os
import platform

import torch

from .aten import ops_with_kernel
from .capabilities import Capabilities, PackageStatus
from .packages import installed_version

__all__ = ["probe_cpu", "probe_cuda", "probe_npu", "probe_xpu"]

_TV = torch.__version__


def _triton_status(device_type: str) -> PackageStatus:
    found, version = installed_version("triton", ("triton", "pytorch-triton", "pytorch-triton-xpu"))
    if not found:
        return PackageStatus("triton", version, False, "not installed")
    if device_type == "cpu":
        if os.environ.get("TRITON_INTERPRET") == "1":
            return PackageStatus("triton", version, True, "through the interpreter, TRITON_INTERPRET=1")
        # Installed and usable here, but only through the interpreter, which must be on
        # before triton is imported: quantcore conformance and the pytest plugin turn it
        # on for CPU runs; this process has not, so its CPU kernels refuse triton.
        return PackageStatus("triton", version, False,
                             "usable through the interpreter only (no GPU here): set TRITON_INTERPRET=1 before "
                             "triton is imported, as quantcore conformance and the pytest plugin do")
    return PackageStatus("triton", version, True)


def _cuda_tile_status() -> PackageStatus:
    found, version = installed_version("cuda.tile", ("cuda-tile",))
    if not found:
        return PackageStatus("cuda.tile", version, False, "not installed")
    from shutil import which

    if which("tileiras") is None:
        return PackageStatus("cuda.tile", version, False, "tileiras compiler not on PATH")
    return PackageStatus("cuda.tile", version, True)


def _plain_status(module: str, dists: tuple[str, ...]) -> PackageStatus:
    found, version = installed_version(module, dists)
    return PackageStatus(module, version, found, "" if found else "not installed")


def _absent(device: str, kind: str, reason: str) -> Capabilities:
    return Capabilities(device=device, device_type=kind, available=False, reason=reason, torch_version=_TV)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_cpu(device: str) -> Capabilities:
    isa = ""
    with contextlib.suppress(AttributeError, RuntimeError):
        isa = torch.backends.cpu.get_cpu_capability()

    return Capabilities(
        device=device,
        device_type="cpu",
        available=True,
        name=_cpu_model(),
        torch_version=_TV,
        packages=(_triton_status("cpu"),),
        aten_ops=ops_with_kernel("CPU"),
        cpu_isa=isa,
        extra=(("threads", str(torch.get_num_threads())),),
    )


def probe_cuda(device: str) -> Capabilities:
    if torch.version.cuda is None and torch.version.hip is None:
        return _absent(device, "cuda", "torch built without CUDA")
    if not torch.cuda.is_available():
        return _absent(device, "cuda", "no CUDA device visible")
    requested = torch.device(device).index
    index = torch.cuda.current_device() if requested is None else requested
    if index >= torch.cuda.device_count():
        return _absent(device, "cuda", f"cuda:{index} requested, {torch.cuda.device_count()} device(s) present")
    props = torch.cuda.get_device_properties(index)
    cc = (props.major, props.minor)
    return Capabilities(
        device=device,
        device_type="cuda",
        torch_version=_TV,
        available=True,
        name=props.name,
        compute_capability=cc,
        packages=(
            _triton_status("cuda"),
            _cuda_tile_status(),
            _plain_status("tensorrt_llm", ("tensorrt_llm", "tensorrt-llm")),
        ),
        aten_ops=ops_with_kernel("CUDA"),
        fp8=cc >= (8, 9),
        fp4=cc >= (10, 0),
        memory_bytes=props.total_memory,
        extra=(("multiprocessors", str(props.multi_processor_count)),),
    )


def probe_xpu(device: str) -> Capabilities:
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not hasattr(xpu, "is_available"):
        return _absent(device, "xpu", "torch built without XPU support")
    if not xpu.is_available():
        return _absent(device, "xpu", "no Intel XPU device visible")
    return Capabilities(
        device=device,
        device_type="xpu",
        torch_version=_TV,
        available=True,
        name=xpu.get_device_name(torch.device(device).index or 0),
        packages=(_triton_status("xpu"),),
        aten_ops=ops_with_kernel("XPU"),
    )


def probe_npu(device: str) -> Capabilities:
    found, version = installed_version("torch_npu", ("torch_npu", "torch-npu"))
    if not found:
        return _absent(device, "npu", "torch_npu not installed")
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:  # a broken vendor install is an answer too
        return _absent(device, "npu", f"torch_npu failed to import: {exc}")
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        return _absent(device, "npu", "no Ascend NPU visible")
    triton_ascend = _plain_status("triton", ("triton-ascend", "triton"))
    return Capabilities(
        device=device,
        device_type="npu",
        torch_version=_TV,
        available=True,
        name=str(npu.get_device_name(torch.device(device).index or 0)),
        packages=(PackageStatus("torch_npu", version, True), triton_ascend),
    )
